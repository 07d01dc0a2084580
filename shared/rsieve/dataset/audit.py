"""The run's proof of accounting, recomputed from what is stored (S3 is the source of
truth), and the plan that re-enqueues shards whose stage output is missing.

Pure: the shell loads the shard index and the stage outputs and hands them in.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rsieve.schemas import (
    QUARANTINE_REASONS,
    REJECT_REASONS,
    STAGE_TASKS,
    STAGES,
    Generation,
    ShardOutput,
)

__all__ = ["STAGES", "AuditResult", "audit_run", "plan_reconcile"]


@dataclass
class AuditResult:
    ok: bool
    problems: list[str]
    # family -> stage -> {"in": n, "out": n, "quarantined": n}
    families: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    missing: dict[str, list[str]] = field(default_factory=dict)
    # Best-of-n: the answers generated (samples of every item), counted beside the items;
    # equal to the items generated with one sample per item.
    samples: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "problems": self.problems,
            "families": self.families,
            "missing": self.missing,
            "samples": self.samples,
        }


def _first_per_line(generations: Iterable[Generation]) -> list[Generation]:
    seen: set[int] = set()
    first = []
    for g in generations:
        if g.item.line not in seen:
            seen.add(g.item.line)
            first.append(g)
    return first


def _sample_problems(outputs: dict[str, dict[str, ShardOutput]]) -> tuple[int, list[str]]:
    """(samples generated, problems): every item's samples verified, and settled with all
    of them counted (best-of-n). An item quarantined after it was generated (the verifier
    or the judge isolated it) is accounted by its quarantine, not by its samples."""
    counts: dict[str, Counter[int]] = {stage: Counter() for stage in ("generate", "verify")}
    for out in outputs.get("generate", {}).values():
        counts["generate"].update(g.item.line for g in out.generations)
    for out in outputs.get("verify", {}).values():
        counts["verify"].update(o.generation.item.line for o in out.verified)
    later = {
        q.line
        for stage in ("verify", "judge")
        for out in outputs.get(stage, {}).values()
        for q in out.quarantined
    }
    problems = [
        f"pool line {line}: {n} samples generated, {counts['verify'][line]} verified"
        for line, n in sorted(counts["generate"].items())
        if counts["verify"][line] != n and outputs.get("verify") and line not in later
    ]
    for out in outputs.get("judge", {}).values():
        for o in out.outcomes:
            line, n = o.generation.item.line, o.samples.n if o.samples else 1
            if n != counts["generate"][line]:
                made = counts["generate"][line]
                problems.append(f"pool line {line}: settled on {n} samples, {made} generated")
    return sum(counts["generate"].values()), problems


def _stage_counts(out: ShardOutput) -> tuple[list[str | None], list[str | None], list[str]]:
    """(families in, families passed on, quarantine reasons) of one stage output."""
    passed: list[str | None]
    if out.stage == "clean":
        passed = [i.family for i in out.items]
    elif out.stage == "generate":  # an item once, however many samples it has
        passed = [g.item.family for g in _first_per_line(out.generations)]
    elif out.stage == "verify":
        passed = [g.item.family for g in _first_per_line(o.generation for o in out.verified)]
    else:
        passed = [o.generation.item.family for o in out.outcomes]
    quarantined: list[str | None] = [q.family for q in out.quarantined]
    return passed + quarantined, passed, [q.reason for q in out.quarantined]


def audit_run(index: dict[str, Any], outputs: dict[str, dict[str, ShardOutput]]) -> AuditResult:
    """Per shard and stage: items in = items passed on + quarantined; per family the same;
    no id placed twice; every reason documented; no stage output missing."""
    problems: list[str] = []
    families: dict[str, dict[str, dict[str, int]]] = defaultdict(
        lambda: defaultdict(lambda: {"in": 0, "out": 0, "quarantined": 0})
    )
    missing: dict[str, list[str]] = {}
    for shard, lines in index["shards"].items():
        expected = lines
        previous: list[str | None] | None = None
        for stage in STAGES:
            out = outputs.get(stage, {}).get(shard)
            if out is None:
                missing.setdefault(stage, []).append(shard)
                break
            entered, passed, reasons = _stage_counts(out)
            if len(entered) != expected:
                problems.append(
                    f"shard {shard} {stage}: {len(entered)} items accounted, {expected} entered"
                )
            if previous is not None and Counter(entered) != Counter(previous):
                problems.append(f"shard {shard} {stage}: families differ from the stage before")
            for fam in entered:
                families[fam or "(unknown)"][stage]["in"] += 1
            for fam in passed:
                families[fam or "(unknown)"][stage]["out"] += 1
            for q in out.quarantined:
                families[q.family or "(unknown)"][stage]["quarantined"] += 1
            problems += [
                f"shard {shard} {stage}: undocumented quarantine reason {r!r}"
                for r in reasons
                if r not in QUARANTINE_REASONS
            ]
            expected, previous = len(passed), passed
    ids: Counter[str] = Counter()
    by_line: Counter[int] = Counter()
    for stage in STAGES:
        for out in outputs.get(stage, {}).values():
            for q in out.quarantined:
                by_line[q.line] += 1
                if q.id is not None and q.reason != "duplicate_id":
                    ids[q.id] += 1
    for out in outputs.get("judge", {}).values():
        for o in out.outcomes:
            ids[o.generation.item.id] += 1
            by_line[o.generation.item.line] += 1
            if o.place == "rejected" and o.reason not in REJECT_REASONS:
                problems.append(
                    f"item {o.generation.item.id}: undocumented reject reason {o.reason!r}"
                )
    problems += [f"id {i!r} placed {n} times" for i, n in sorted(ids.items()) if n > 1]
    problems += [f"pool line {ln} placed {n} times" for ln, n in sorted(by_line.items()) if n > 1]
    if missing:
        problems.append(
            "stage outputs missing: "
            + ", ".join(f"{stage} {len(shards)} shard(s)" for stage, shards in missing.items())
        )
    placed = sum(by_line.values())
    if not missing and placed != index["lines"]:
        problems.append(f"{placed} items placed, {index['lines']} entered")
    samples, sample_problems = _sample_problems(outputs)
    problems += sample_problems
    fams = {f: dict(s) for f, s in sorted(families.items())}
    return AuditResult(
        ok=not problems, problems=problems, families=fams, missing=missing, samples=samples
    )


def plan_reconcile(
    index: dict[str, Any] | None, present: dict[str, set[str]], *, compacted: bool
) -> list[tuple[str, dict[str, Any]]]:
    """The tasks to enqueue so every shard reaches its next missing stage: (task, kwargs).

    Safe to run any time: every stage skips shards whose output exists, so a task
    enqueued for a shard already in flight does no work twice."""
    if index is None:
        return [("rsieve.ingest", {})]
    plan: list[tuple[str, dict[str, Any]]] = []
    for shard, lines in index["shards"].items():
        for stage in STAGES:
            if shard not in present.get(stage, set()):
                plan.append((STAGE_TASKS[stage], {"shard": shard, "lines": lines}))
                break
    if not plan and not compacted:
        plan.append(("rsieve.compact", {}))
    return plan


def stalled(last_activity: float | None, submitted_at: float, now: float, after_s: float) -> bool:
    """A run nothing has happened to for `after_s` seconds: no stage output recorded since
    (or, before any, since its submission). Long past the visibility timeout, that is a
    run whose messages were lost (a broker without persistence restarted, a queue purged),
    not a slow one: the sweeper reconciles it (`plan_reconcile`)."""
    return now - max(last_activity or 0.0, submitted_at) > after_s
