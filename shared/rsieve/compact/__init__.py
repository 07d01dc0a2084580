"""Compaction: best-of-n samples settled into one outcome per item, which outcomes a run
adds to a dataset (qa keys, the key index), and the rows of the splits.

After rsieve.judge."""
