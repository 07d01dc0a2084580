"""The judge: its prompt and verdict parsing (verdicts), the cascade after the verifier,
calibration with its canaries, and the verdict cache.

After rsieve.generate (and the verifier, whose rules are the base's rsieve.verify)."""
