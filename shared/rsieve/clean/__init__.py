"""Cleaning: the pool's rules (provenance, task purity, decontamination, multiple-choice
normalisation), the ingest rounds, and the question text the model receives.

After rsieve.run; imports only the base and rsieve.run."""
