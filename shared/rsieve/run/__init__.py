"""A run's identity and how its pool is cut: shards, image packs, partitions, the run id,
ready pool folders.

The first stage. Like every stage it imports only the base (the modules directly under
rsieve) and earlier stages; tests/unit/test_core_boundaries.py holds that."""
