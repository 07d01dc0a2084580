"""What each role asks of its model, read from the settings in one place: which model, on
which interface and where, with which tokenizer, budget and sampling, and whether its
outputs are watched for loops. The generator samples as the run says and is watched; the
judge is greedy, has its own budget and is never cut.

The adapters (rsieve.adapters.model.TritonModel, rsieve.adapters.openai_compat.OpenAIModel)
take a `RoleChoice` in their `from_settings`; rsieve.adapters.model.open_model gives the
role's adapter. Nothing here opens a connection.
"""

from __future__ import annotations

from dataclasses import dataclass

from rsieve.generate.loops import LoopRule
from rsieve.settings import Settings
from rsieve.settings.models import ModelRole

__all__ = ["RoleChoice", "engine_url", "role_choice"]


@dataclass(frozen=True)
class RoleChoice:
    """One role's model as the settings name it. `url`: its Triton server or its
    OpenAI-compatible base URL; `kind`: what the settings say it is (Triton reads its own
    from the model's config); `loops`: the watch of its outputs, None for none."""

    role: ModelRole
    model: str
    interface: str
    url: str
    tokenizer: str
    max_new_tokens: int
    temperature: float
    top_p: float
    kind: str | None
    loops: LoopRule | None


def role_choice(settings: Settings, role: ModelRole) -> RoleChoice:
    s = settings
    if role == "judge":
        return RoleChoice(
            role=role,
            model=s.judge_model,
            interface=s.interface_of(role),
            url=engine_url(s, role),
            tokenizer=s.judge_tokenizer,
            max_new_tokens=s.judge_max_new_tokens,
            # The judge is greedy, whatever the generator samples at.
            temperature=0.0,
            top_p=1.0,
            kind=s.judge_kind,
            loops=None,
        )
    return RoleChoice(
        role=role,
        model=s.generator_model,
        interface=s.interface_of(role),
        url=engine_url(s, role),
        tokenizer=s.generator_tokenizer,
        max_new_tokens=s.max_new_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        kind=s.generator_kind,
        loops=LoopRule.of(s),
    )


def engine_url(settings: Settings, role: ModelRole) -> str:
    """Where the role's engine is: its OpenAI-compatible base URL or its Triton server."""
    s = settings
    if s.interface_of(role) == "openai":
        return s.openai_url_of(role)
    if role == "judge":
        return s.judge_triton_grpc_url or s.triton_grpc_url
    return s.triton_grpc_url
