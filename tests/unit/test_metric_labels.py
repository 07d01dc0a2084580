"""Family labels of the counters are pool text: bounded in number and length
(rsieve.adapters.metrics), so Redis and the scrape never grow with what a pool names."""

from __future__ import annotations

import json

import fakeredis
import pytest

from rsieve import redis_keys
from rsieve.adapters import metrics
from rsieve.schemas import Quarantined, ShardOutput


def shard(families: list[str], shard: str = "00000") -> ShardOutput:
    return ShardOutput(
        run="r-000000000000",
        shard=shard,
        stage="clean",
        lines=len(families),
        quarantined=[
            Quarantined(id=f"i{k}", line=k + 1, family=f, stage="clean", reason="invalid_json")
            for k, f in enumerate(families)
        ],
    )


def labels(client: fakeredis.FakeRedis) -> set[str]:
    fields = client.hkeys(redis_keys.metric_counter("rsieve_quarantined"))
    return {json.loads(f)[1] for f in fields}


def test_families_past_the_bound_count_as_other(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "MAX_FAMILY_LABELS", 2)
    client = fakeredis.FakeRedis()
    store = metrics.RedisMetrics(client)
    store.record_shard(shard(["A", "B"]))
    store.record_shard(shard(["C", "D", "A"], "00001"))
    assert labels(client) == {"A", "B", metrics.OTHER_FAMILY}
    assert client.scard(metrics.FAMILY_LABELS) == 2
    counts = {
        json.loads(f)[1]: float(v)
        for f, v in client.hgetall(redis_keys.metric_counter("rsieve_quarantined")).items()
    }
    assert counts == {"A": 2.0, "B": 1.0, metrics.OTHER_FAMILY: 2.0}  # nothing is lost


def test_a_long_family_name_is_cut() -> None:
    client = fakeredis.FakeRedis()
    metrics.RedisMetrics(client).record_shard(shard(["F" * 5000]))
    assert labels(client) == {"F" * metrics.LABEL_CHARS}
