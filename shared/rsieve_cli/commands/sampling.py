"""The sampling options `rsieve run` and `rsieve submit` both take: a run's own sampling,
as the API's `sampling` takes it (rsieve.settings.SAMPLING; docs/sampling.md)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import typer

from rsieve_cli.shell import Failure

Samples = Annotated[
    int | None,
    typer.Option(help="answers per question (best-of-n; more than 1 needs --temperature)"),
]
Temperature = Annotated[float | None, typer.Option(help="the generator's sampling temperature")]
Seed = Annotated[int | None, typer.Option(help="base seed: sample k of an item gets its own")]
Keep = Annotated[str | None, typer.Option(help="accepted answers kept per item: first|distinct")]
MaxKept = Annotated[int | None, typer.Option(help="at most this many kept per item (distinct)")]
Circular = Annotated[
    bool | None,
    typer.Option(
        "--circular/--no-circular",
        help="multiple choice: sample k sees the options rotated by k; accepted only if all are",
    ),
]
BlindPass = Annotated[
    bool | None,
    typer.Option(
        "--blind-pass/--no-blind-pass",
        help="ask every accepted item again without its image; flag those still answered right",
    ),
]
BlindPolicy = Annotated[
    str | None,
    typer.Option(
        help="what an item answered right without its image does: keep (flagged) | nothink "
        "(kept out of _RS_think) | drop (rejected)"
    ),
]
PairRejections = Annotated[
    bool | None,
    typer.Option(
        "--judge-pair-rejections/--no-judge-pair-rejections",
        help="best-of-n: also judge the refused samples of items that passed, one call per "
        "distinct answer (for preference pairs)",
    ),
]
Enough = Annotated[
    int | None,
    typer.Option(
        help="adaptive best-of-n: an item stops once K samples passed (default 1 with "
        "--keep first and no window; 0: every sample drawn)"
    ),
]
SampleRound = Annotated[
    int | None,
    typer.Option(help="samples asked per item per round (default max(K, samples/4))"),
]
Window = Annotated[
    str | None,
    typer.Option(help="LOW,HIGH: keep accepted items whose pass rate lies within (e.g. 0.2,0.8)"),
]

# The sampling options, each a parameter of the commands that take them (`takes_sampling`),
# named as the API's field but pass_rate_window, which the command line takes as text.
OPTIONS: dict[str, Any] = {
    "samples": Samples,
    "temperature": Temperature,
    "seed": Seed,
    "keep": Keep,
    "max_kept": MaxKept,
    "pass_rate_window": Window,
    "enough": Enough,
    "sample_round": SampleRound,
    "circular": Circular,
    "blind_pass": BlindPass,
    "blind_policy": BlindPolicy,
    "judge_pair_rejections": PairRejections,
}


def chosen_sampling(options: Mapping[str, Any]) -> dict[str, Any] | None:
    """The sampling given on the command line (OPTIONS by name), as the API takes it: only
    the options given, None when none was."""
    chosen = dict(options)
    window = chosen["pass_rate_window"]
    try:
        chosen["pass_rate_window"] = [float(x) for x in window.split(",")] if window else None
    except ValueError:
        raise Failure(f"--pass-rate-window {window!r}", "give LOW,HIGH, e.g. 0.2,0.8") from None
    return {k: v for k, v in chosen.items() if v is not None} or None


KEYWORD = inspect.Parameter.POSITIONAL_OR_KEYWORD


def takes_sampling(command: Callable[..., None]) -> Callable[..., None]:
    """Give `command` every sampling option (its signature, which typer reads, gains
    OPTIONS) and call it with what was chosen as `sampling` (chosen_sampling), so the
    commands that take them declare them once, here."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for name, p in signature.parameters.items() if name != "sampling"]
    added = [
        inspect.Parameter(name, KEYWORD, default=None, annotation=kind)
        for name, kind in OPTIONS.items()
    ]

    @functools.wraps(command)
    def with_sampling(*args: Any, **kwargs: Any) -> None:
        options = {name: kwargs.pop(name, None) for name in OPTIONS}
        command(*args, sampling=chosen_sampling(options), **kwargs)

    with_sampling.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
    return with_sampling
