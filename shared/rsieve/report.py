"""Run accounting: every item that entered ends in exactly one place, and the report
proves it per family (in = accepted + rejected + quarantined)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from rsieve.schemas import Outcome, Quarantined

__all__ = ["run_report"]

UNKNOWN_FAMILY = "(unknown)"


def run_report(
    *, run: str, lines: int, outcomes: list[Outcome], quarantined: list[Quarantined],
    blank_lines: list[int] | None = None,
) -> dict[str, Any]:
    """`lines` items entered (non-blank lines); `blank_lines` are the pool's blank line
    numbers, which hold no item. Every other line from 1 on must be placed exactly once."""
    families: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"in": 0, "accepted": 0, "accepted_by_verifier": 0, "promoted_by_judge": 0,
                 "rejected": 0, "rejected_by_reason": Counter(), "quarantined": 0,
                 "quarantined_by_reason": Counter()}
    )
    ids: Counter[str] = Counter()
    placed_lines: Counter[int] = Counter()
    for outcome in outcomes:
        item = outcome.generation.item
        fam = families[item.family]
        fam["in"] += 1
        ids[item.id] += 1
        placed_lines[item.line] += 1
        if outcome.place == "accepted":
            fam["accepted"] += 1
            key = "promoted_by_judge" if outcome.promoted_by == "judge" else "accepted_by_verifier"
            fam[key] += 1
        else:
            fam["rejected"] += 1
            fam["rejected_by_reason"][outcome.reason or "unknown"] += 1
    for q in quarantined:
        fam = families[q.family or UNKNOWN_FAMILY]
        fam["in"] += 1
        fam["quarantined"] += 1
        fam["quarantined_by_reason"][q.reason] += 1
        placed_lines[q.line] += 1
        if q.id is not None and q.reason != "duplicate_id":
            ids[q.id] += 1
    for fam in families.values():
        fam["rejected_by_reason"] = dict(sorted(fam["rejected_by_reason"].items()))
        fam["quarantined_by_reason"] = dict(sorted(fam["quarantined_by_reason"].items()))
        fam["adds_up"] = fam["in"] == fam["accepted"] + fam["rejected"] + fam["quarantined"]
    placed = sum(placed_lines.values())
    duplicate_ids = sorted(i for i, n in ids.items() if n > 1)
    lines_twice = sorted(ln for ln, n in placed_lines.items() if n > 1)
    blanks = set(blank_lines or ())
    expected = set(range(1, lines + len(blanks) + 1)) - blanks
    missing = sorted(expected - set(placed_lines))
    outside = sorted(set(placed_lines) - expected)
    return {
        "run": run,
        "lines": lines,
        "placed": placed,
        "families": dict(sorted(families.items())),
        "duplicate_ids": duplicate_ids,
        "lines_placed_twice": lines_twice,
        "lines_missing": missing[:100],
        "lines_outside_pool": outside[:100],
        "blank_lines": len(blanks),
        "adds_up": placed == lines and not lines_twice and not missing and not outside
        and not duplicate_ids,
    }
