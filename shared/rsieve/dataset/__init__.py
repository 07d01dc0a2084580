"""The dataset: the run report, the card, the proof of accounting, the commit of a run,
the trainer export and recheck.

The last stage: it may import any other."""
