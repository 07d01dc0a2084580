"""What a settings field is to a run, declared beside the field (`Annotated[..., DECIDES]`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Role:
    """What a settings field is to a run, declared beside the field (Annotated) so the
    field and its role are one line: `deciding` when a different value can put an item
    in another place, give a row other content or change what the card reports (the run
    id is derived from these, so changing one makes a new run); `operational` when it only
    changes how, where or how fast the run is executed. Secrets are never deciding.
    `since_first_ids`: a deciding field added after run ids were first given out, which
    enters a run's id only when set to something other than its default (SINCE_FIRST_IDS)."""

    kind: Literal["deciding", "operational"]
    since_first_ids: bool = False


DECIDES = Role("deciding")
SINCE_FIRST_ID = Role("deciding", since_first_ids=True)
OPERATES = Role("operational")
