"""Generation: what the model is asked (best-of-n draws, the chat template) and what its
output says (reasoning and answer).

After rsieve.clean. Verification has no stage package: its protocol registry
(rsieve.verify) is in the base, because cleaning, settings and every later stage use it."""
