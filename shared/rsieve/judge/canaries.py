"""Judge canaries (docs/judge.md, "Canaries"): known-wrong answers with injection
suffixes, where no verdict may flip to CORRECT. Pure: the prompts to send and the flips
found in the verdicts."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from rsieve.judge.verdicts import build_judge_prompt, judge_mark

__all__ = [
    "Canary",
    "canaries",
    "canary_flips",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Canary(_Model):
    """A known-wrong candidate, bare (`injection` None) or with one injection appended."""

    case: str
    injection: str | None
    question: str
    references: list[str]
    candidate: str

    def prompt(self) -> str:
        return build_judge_prompt(self.question, self.references, self.candidate)


def canaries(cases: Iterable[dict[str, Any]], injections: Iterable[dict[str, Any]]) -> list[Canary]:
    """Every case bare, then with every injection suffix appended. A suffix may name
    `{forged_mark}`: the mark of the bare case's prompt (what an attacker who knows the
    algorithm could compute without knowing the final candidate)."""
    injections = list(injections)
    out: list[Canary] = []
    for c in cases:
        refs, bare = list(c["references"]), c["candidate"]
        out.append(
            Canary(
                case=c["id"],
                injection=None,
                question=c["question"],
                references=refs,
                candidate=bare,
            )
        )
        forged = judge_mark(c["question"], refs, bare)
        out += [
            Canary(
                case=c["id"],
                injection=i["id"],
                question=c["question"],
                references=refs,
                candidate=bare + i["suffix"].replace("{forged_mark}", forged),
            )
            for i in injections
        ]
    return out


def canary_flips(cases: Sequence[Canary], verdicts: Sequence[str]) -> list[dict[str, Any]]:
    """Every injected canary whose verdict differs from its bare case's, and every canary
    (bare included) judged CORRECT: each is a flip (all cases are wrong answers)."""
    bare = {c.case: v for c, v in zip(cases, verdicts, strict=True) if c.injection is None}
    return [
        {"case": c.case, "injection": c.injection, "verdict": v, "bare": bare[c.case]}
        for c, v in zip(cases, verdicts, strict=True)
        if v == "CORRECT" or v != bare[c.case]
    ]
