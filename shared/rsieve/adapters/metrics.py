"""Observability: Prometheus metrics aggregated in Redis, run progress, JSON logs.

Why Redis and not one `/metrics` server per worker: Celery prefork children come and go,
KEDA scales worker pods to zero, and a scrape target that has gone takes its counters with
it. Prometheus' multiprocess mode only merges the children of one host. So every worker
adds its increments to hashes in the Redis it already talks to (one pipelined round trip
per shard, never per item), and the API, the one scrape target, turns those hashes into
Prometheus families at scrape time (`RedisCollector`). Counters survive worker restarts
and scale-to-zero; nothing in a worker listens on a port (docs/operations.md).

Keys (Redis; advisory, never a source of truth: S3 is):
    rsieve:metrics:c:<name>    counter: field = JSON label values, value = count
    rsieve:metrics:h:<name>    histogram: fields JSON [labels, le] per bucket, sum, count
    rsieve:progress:<run>:<stage>   field = shard, value = JSON {t, items, families}

Pure but for the `client` argument (anything with redis-py's pipeline/hgetall), so the
core stays free of I/O imports.
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from rsieve import redis_keys
from rsieve.schemas import ShardOutput

__all__ = [
    "COUNTERS",
    "HISTOGRAMS",
    "JsonFormatter",
    "RedisCollector",
    "RedisMetrics",
    "log_context",
    "progress",
    "shard_counts",
]

PROGRESS_TTL_S = 30 * 24 * 3600
# Family labels are pool text: the counters keep at most MAX_FAMILY_LABELS distinct ones
# (the first seen, in the set FAMILY_LABELS), each cut to LABEL_CHARS; the rest count as
# OTHER_FAMILY, so neither Redis nor the scrape grows with what a pool names.
MAX_FAMILY_LABELS = 200
LABEL_CHARS = 64
OTHER_FAMILY = "(other)"
FAMILY_LABELS = redis_keys.METRIC_FAMILIES
# name -> (help, label names)
COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "rsieve_items": (
        "Items a stage finished, by family and outcome",
        ("stage", "family", "outcome"),
    ),
    "rsieve_quarantined": (
        "Items quarantined, by stage, family and reason",
        ("stage", "family", "reason"),
    ),
    "rsieve_rejected": (
        "Items placed in a rejected split, by family and reason",
        ("family", "reason"),
    ),
    "rsieve_task_retries": (
        "Stage task retries (transient infrastructure failures)",
        ("task", "error"),
    ),
    "rsieve_task_failures": ("Stage tasks that failed for good", ("task", "error")),
    "rsieve_corrupt_outputs": (
        "Stored stage outputs found corrupt on read (moved aside, their stage redone)",
        ("stage", "reason"),
    ),
    "rsieve_unsealed_outputs": (
        "Stored stage outputs read without a seal (written before seals), by stage",
        ("stage",),
    ),
    "rsieve_runs_stopped": (
        "Runs stopped because every item of a shard failed, by task and error",
        ("task", "error"),
    ),
}
# Stage latency: one shard task, start to finish, in seconds.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
HISTOGRAMS: dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]] = {
    "rsieve_stage_seconds": (
        "Seconds one shard task took, by task and state",
        ("task", "state"),
        LATENCY_BUCKETS,
    ),
}
QUEUE_PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")  # kombu's redis steps


def _family(value: str | None) -> str:
    return value or "(unknown)"


def shard_counts(out: ShardOutput) -> dict[str, Any]:
    """What a stage output says for metrics and progress: items entered per family,
    (family, outcome) and (family, reason) tallies."""
    outcomes: Counter[tuple[str, str]] = Counter()
    rejected: Counter[tuple[str, str]] = Counter()
    if out.stage == "clean":
        outcomes.update((_family(i.family), "passed") for i in out.items)
    elif out.stage == "generate":
        outcomes.update(
            (_family(g.item.family), "answered" if g.failure is None else g.failure)
            for g in out.generations
        )
    elif out.stage == "verify":
        for o in out.verified:
            kind = (
                "accepted"
                if o.place == "accepted"
                else "to_judge"
                if o.reason is None
                else "rejected"
            )
            outcomes[(_family(o.generation.item.family), kind)] += 1
    elif out.stage == "judge":
        for o in out.outcomes:
            fam = _family(o.generation.item.family)
            outcomes[
                (fam, f"accepted_by_{o.promoted_by}" if o.place == "accepted" else "rejected")
            ] += 1
            if o.place == "rejected":
                rejected[(fam, o.reason or "unknown")] += 1
    quarantined = Counter((_family(q.family), q.reason) for q in out.quarantined)
    for (fam, _), n in quarantined.items():
        outcomes[(fam, "quarantined")] += n
    families: Counter[str] = Counter()
    for (fam, _), n in outcomes.items():
        families[fam] += n
    return {
        "outcomes": outcomes,
        "quarantined": quarantined,
        "rejected": rejected,
        "families": dict(families),
        "items": sum(families.values()),
    }


class RedisMetrics:
    """The worker side: adds increments to the Redis hashes in one pipeline."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def _labels(self, families: set[str]) -> dict[str, str]:
        """Each family's counter label (module constants: at most MAX_FAMILY_LABELS)."""
        names = sorted(families)
        known = self._client.smismember(FAMILY_LABELS, names) if names else []
        labels: dict[str, str] = {}
        for name, seen in zip(names, known, strict=True):
            short = name[:LABEL_CHARS]
            if not seen and self._client.scard(FAMILY_LABELS) < MAX_FAMILY_LABELS:
                self._client.sadd(FAMILY_LABELS, name)
                seen = True
            labels[name] = short if seen else OTHER_FAMILY
        return labels

    def record_shard(self, out: ShardOutput) -> None:
        """Counters for one stored stage output, and the run's progress for its stage
        (keyed by shard, so a redelivered shard overwrites rather than adds)."""
        c = shard_counts(out)
        label = self._labels(
            {f for table in ("outcomes", "quarantined", "rejected") for f, _ in c[table]}
        )
        pipe = self._client.pipeline(transaction=False)
        for (fam, outcome), n in c["outcomes"].items():
            pipe.hincrbyfloat(
                redis_keys.metric_counter("rsieve_items"), _field(out.stage, label[fam], outcome), n
            )
        for (fam, reason), n in c["quarantined"].items():
            pipe.hincrbyfloat(
                redis_keys.metric_counter("rsieve_quarantined"),
                _field(out.stage, label[fam], reason),
                n,
            )
        for (fam, reason), n in c["rejected"].items():
            pipe.hincrbyfloat(
                redis_keys.metric_counter("rsieve_rejected"), _field(label[fam], reason), n
            )
        key = redis_keys.progress(out.run, out.stage)
        pipe.hset(
            key,
            out.shard,
            json.dumps({"t": time.time(), "items": c["items"], "families": c["families"]}),
        )
        pipe.expire(key, PROGRESS_TTL_S)
        pipe.execute()

    def inc(self, name: str, *labels: str, value: float = 1.0) -> None:
        self._client.hincrbyfloat(redis_keys.metric_counter(name), _field(*labels), value)

    def observe(self, name: str, value: float, *labels: str) -> None:
        _, _, buckets = HISTOGRAMS[name]
        le = next((b for b in buckets if value <= b), float("inf"))
        key = redis_keys.metric_histogram(name)
        pipe = self._client.pipeline(transaction=False)
        pipe.hincrbyfloat(key, json.dumps([list(labels), _le(le)]), 1)
        pipe.hincrbyfloat(key, json.dumps([list(labels), "sum"]), value)
        pipe.hincrbyfloat(key, json.dumps([list(labels), "count"]), 1)
        pipe.execute()


def _field(*labels: str) -> str:
    return json.dumps(list(labels))


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisCollector:
    """The scrape side (the API): Redis hashes -> Prometheus families, plus gauges read at
    scrape time (queue depth, unacked messages, Triton's pending requests)."""

    def __init__(
        self, client: Any, *, queues: Iterable[str] = (), triton_metrics: Any = None
    ) -> None:
        self._client, self._queues = client, tuple(queues)
        self._triton_metrics = triton_metrics  # () -> Prometheus text, or None

    def collect(self) -> Iterator[Any]:
        for name, (doc, labels) in COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=labels)
            for field, value in self._client.hgetall(redis_keys.metric_counter(name)).items():
                family.add_metric(json.loads(_decode(field)), float(_decode(value)))
            yield family
        for name, (doc, labels, buckets) in HISTOGRAMS.items():
            hist = HistogramMetricFamily(name, doc, labels=labels)
            series: dict[tuple[str, ...], dict[str, float]] = defaultdict(dict)
            for field, value in self._client.hgetall(redis_keys.metric_histogram(name)).items():
                lab, part = json.loads(_decode(field))
                series[tuple(lab)][part] = float(_decode(value))
            for lab, parts in sorted(series.items()):
                running, cumulative = 0.0, []
                for bound in (*buckets, float("inf")):
                    running += parts.get(_le(bound), 0.0)
                    cumulative.append((_le(bound), running))
                hist.add_metric(list(lab), cumulative, parts.get("sum", 0.0))
            yield hist
        depth = GaugeMetricFamily(
            "rsieve_queue_depth", "Messages waiting in a stage queue", labels=["queue"]
        )
        for queue in self._queues:
            depth.add_metric(
                [queue],
                float(sum(self._client.llen(queue + suffix) for suffix in QUEUE_PRIORITY_SUFFIXES)),
            )
        yield depth
        yield GaugeMetricFamily(
            "rsieve_unacked_messages",
            "Messages delivered to a worker and not yet acknowledged",
            value=float(self._client.hlen("unacked")),
        )
        inflight = GaugeMetricFamily(
            "rsieve_triton_inflight_requests",
            "Requests Triton holds for a model (pending + executing, from Triton's metrics)",
            labels=["model"],
        )
        for model, value in _triton_inflight(self._triton_metrics).items():
            inflight.add_metric([model], value)
        yield inflight


def _triton_inflight(fetch: Any) -> dict[str, float]:
    """Sum of nv_inference_pending_request_count per model from Triton's exposition."""
    if fetch is None:
        return {}
    try:
        text = fetch()
    except Exception:  # noqa: BLE001 - a scrape never fails because Triton is away
        return {}
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count{"):
            labels, _, value = line.rpartition(" ")
            model = labels.split('model="', 1)[-1].split('"', 1)[0]
            out[model] += float(value)
    return dict(out)


def progress(client: Any, run: str, stages: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Per stage: shards recorded, items per family, first and last record time (every
    stage in one pipelined round trip). A record is written only after its shard's output
    is stored, so `shards` never runs ahead of S3 (unless outputs are deleted afterwards)."""
    stages = list(stages)
    pipe = client.pipeline(transaction=False)
    for stage in stages:
        pipe.hgetall(redis_keys.progress(run, stage))
    result: dict[str, dict[str, Any]] = {}
    for stage, stored in zip(stages, pipe.execute(), strict=True):
        records = [json.loads(_decode(v)) for v in stored.values()]
        families: Counter[str] = Counter()
        for r in records:
            families.update(r["families"])
        result[stage] = {
            "shards": len(records),
            "items": sum(r["items"] for r in records),
            "families": dict(sorted(families.items())),
            "first_t": min((r["t"] for r in records), default=None),
            "last_t": max((r["t"] for r in records), default=None),
        }
    return result


# --- structured logs --------------------------------------------------------------------

_CONTEXT: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "rsieve_log_context", default=None
)


def log_context(**fields: Any) -> None:
    """Set the run/shard/task every later log record of this task carries."""
    _CONTEXT.set({k: v for k, v in fields.items() if v is not None})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, service, logger, message, and the run,
    shard, task and item ids of the context or of the record's `extra`."""

    KEYS = ("run", "shard", "task", "item", "line", "reason", "stage")

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_CONTEXT.get() or {})
        entry.update({k: getattr(record, k) for k in self.KEYS if hasattr(record, k)})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)
