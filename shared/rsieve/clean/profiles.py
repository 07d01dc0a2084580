"""What a dataset remembers of each family's task, for task purity (rsieve.clean.purity):
a family profile counts the question forms, exact questions and origins of the on-task
items the dataset holds, and their reference form. A later pool's purity is judged against
its family's profile together with the pool's own items, so a small or mostly polluted
pool is not judged against itself.

Mergeable and bounded: `merge` of two profiles is the profile of both runs, keeping the
PROFILE_ENTRIES most frequent forms, questions and origins of each kind (ties by text), so
a dataset's profile has the same size after ten runs as after a million.

Pure: the caller reads and writes `datasets/<dataset>/profiles.json` (rsieve.keys).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict

__all__ = [
    "PROFILES_FILE",
    "PROFILE_ENTRIES",
    "PROFILE_VERSION",
    "FamilyProfile",
    "dominant_form",
    "merge",
    "merge_profiles",
    "profiles_json",
    "profiles_of",
    "top",
]

PROFILE_VERSION = "profile/1"
# Entries kept per counter: the forms, exact questions and origins a family's task is told
# by are few (a benchmark asks a handful of phrasings); the long tail only adds size.
PROFILE_ENTRIES = 256


def top(counts: Mapping[str, int], entries: int = PROFILE_ENTRIES) -> dict[str, int]:
    """The `entries` most frequent keys of `counts` (ties by key), most frequent first."""
    ranked = sorted(((k, n) for k, n in counts.items() if n > 0), key=lambda kv: (-kv[1], kv[0]))
    return dict(ranked[:entries])


class FamilyProfile(BaseModel):
    """A family's on-task items in a dataset, counted as task purity reads them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    family: str
    protocol: str
    items: int = 0  # on-task items counted
    runs: int = 0  # runs merged into it
    forms: dict[str, int] = {}  # question form (purity._form) -> items
    exact: dict[str, int] = {}  # exact question (case and whitespace folded) -> items
    origins: dict[str, int] = {}  # origin -> items
    origin_items: int = 0  # items that carry an origin (the counters may be cut)
    answered: int = 0  # items with a reference
    describing: int = 0  # of which answered by an attribute of the text (reference form)

    @classmethod
    def counted(
        cls,
        family: str,
        protocol: str,
        *,
        forms: Iterable[str],
        exact: Iterable[str],
        origins: Iterable[str | None],
        answered: int,
        describing: int,
    ) -> FamilyProfile:
        """The profile of one run's on-task items (one form, question and origin each)."""
        form_counts = Counter(forms)
        origin_list = list(origins)
        named = Counter(o for o in origin_list if o is not None)
        return cls(
            family=family,
            protocol=protocol,
            items=sum(form_counts.values()),
            runs=1,
            forms=top(form_counts),
            exact=top(Counter(exact)),
            origins=top(named),
            origin_items=sum(named.values()),
            answered=answered,
            describing=describing,
        )


def merge(a: FamilyProfile, b: FamilyProfile) -> FamilyProfile:
    """The profile of both: counts added, each counter cut to PROFILE_ENTRIES. The protocol
    is the later one's (`b`), as the family's current protocol."""
    if a.family != b.family:
        raise ValueError(f"cannot merge the profiles of {a.family!r} and {b.family!r}")
    return FamilyProfile(
        family=b.family,
        protocol=b.protocol,
        items=a.items + b.items,
        runs=a.runs + b.runs,
        forms=top(Counter(a.forms) + Counter(b.forms)),
        exact=top(Counter(a.exact) + Counter(b.exact)),
        origins=top(Counter(a.origins) + Counter(b.origins)),
        origin_items=a.origin_items + b.origin_items,
        answered=a.answered + b.answered,
        describing=a.describing + b.describing,
    )


def merge_profiles(
    held: Mapping[str, FamilyProfile], added: Mapping[str, FamilyProfile]
) -> dict[str, FamilyProfile]:
    """A dataset's profiles after a run's are added, by family (sorted)."""
    out = dict(held)
    for family, profile in added.items():
        out[family] = merge(out[family], profile) if family in out else profile
    return dict(sorted(out.items()))


def dominant_form(profile: FamilyProfile | None) -> str | None:
    """The profile's most frequent question form, or None for an empty profile."""
    if profile is None or not profile.forms:
        return None
    return next(iter(top(profile.forms, 1)))


# The dataset file that holds its families' profiles, one per commit (listed in the
# manifest's files like the card and the report).
PROFILES_FILE = "profiles.json"


def profiles_of(data: Mapping[str, object] | None) -> dict[str, FamilyProfile]:
    """A profiles.json's content (family -> profile), or none for a dataset without one."""
    return {
        family: FamilyProfile.model_validate(profile) for family, profile in (data or {}).items()
    }


def profiles_json(profiles: Mapping[str, FamilyProfile]) -> bytes:
    """profiles.json: family -> profile, sorted, one indent."""
    return json.dumps(
        {f: p.model_dump() for f, p in sorted(profiles.items())}, indent=1, sort_keys=True
    ).encode()
