"""What ingest screens a pool against (rsieve.decontam): every registered evaluation set
(`evalsets/<name>.json`) and the (image hash, question) pairs of every run already
committed to the run's dataset (`datasets/<dataset>/keys/<run>.near.json`, written by the
compactor). Read once per ingest; a screen task of a pool ingested in rounds keeps the
committed pairs of its own partition alone (`keep(question key, answer key)`)."""

from __future__ import annotations

import json
from collections.abc import Callable

from rsieve.decontam import EVALSET_PREFIX, EvalSet, Screen
from services.common import Context


def load_screen(
    ctx: Context, dataset: str, keep: Callable[[str, str], bool] | None = None
) -> Screen:
    store, s = ctx.store, ctx.settings
    evalsets = {}
    for key in store.list(EVALSET_PREFIX):
        if key.endswith(".json"):
            es = EvalSet.from_json(store.get(key))
            evalsets[es.name] = es
    committed = {}
    keys = f"datasets/{dataset}/keys/"
    for key in store.list(keys):
        if key.endswith(".near.json"):
            run = key[len(keys) : -len(".near.json")]
            committed[run] = [
                (str(h), str(q), str(a))
                for h, q, a in json.loads(store.get(key))
                if keep is None or keep(str(q), str(a))
            ]
    return Screen(
        distance=s.near_duplicate_distance,
        evalsets=evalsets,
        committed=committed,
        match=s.evalset_match,
    )
