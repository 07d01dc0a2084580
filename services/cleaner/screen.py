"""What ingest screens a pool against (rsieve.clean.decontam): every registered evaluation
set (`evalsets/<name>.json`) and the keys (image hash and its crops', question, answer) of
every run already committed to the run's dataset (`datasets/<dataset>/keys/<run>.near.json`,
written by the compactor). Read once per ingest; a screen task of a pool ingested in rounds
keeps the committed keys of its own partition alone (`keep(question key, answer key)`)."""

from __future__ import annotations

from collections.abc import Callable

from rsieve import keys
from rsieve.clean.decontam import EvalSet, Screen, read_dataset_keys
from services.context import Context


def load_screen(
    ctx: Context, dataset: str, keep: Callable[[str, str], bool] | None = None
) -> Screen:
    store, s = ctx.store, ctx.settings
    evalsets = {}
    for key in store.list(keys.EVALSETS_PREFIX):
        if keys.evalset_name(key) is not None:
            es = EvalSet.from_json(store.get(key))
            evalsets[es.name] = es
    committed = {}
    for key in store.list(keys.dataset_keys_prefix(dataset)):
        if (run := keys.near_keys_run(dataset, key)) is not None:
            committed[run] = [
                entry
                for entry in read_dataset_keys(store.get(key))
                if keep is None or keep(entry[1], entry[2])
            ]
    return Screen(
        distance=s.near_duplicate_distance,
        evalsets=evalsets,
        committed=committed,
        match=s.evalset_match,
    )
