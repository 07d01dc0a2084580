"""The commands that make and read runs: `run` (end to end on the local stack), `submit`
(through the API), `audit`, `reconcile`, `export` and `card`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rsieve import keys
from rsieve.errors import RsieveError
from rsieve.schemas import STAGES
from rsieve_cli import shell
from rsieve_cli.commands.sampling import takes_sampling
from rsieve_cli.shell import Failure, console, friendly

Pool = Annotated[Path, typer.Argument(help="pool folder with items.jsonl and images")]
Dataset = Annotated[str | None, typer.Option(help="dataset name (default: pool folder)")]
Run = Annotated[str, typer.Argument(metavar="RUN", help="run id")]
AsJson = Annotated[bool, typer.Option("--json")]


@friendly
def audit(run_id: Run, as_json: AsJson = False) -> None:
    """Prove from storage that every item of RUN ended in exactly one place (exit 0 if so)."""
    from rsieve.dataset.audit import audit_run
    from rsieve.errors import NotFoundError
    from services import runs

    ctx = shell.context()
    try:
        runs.spec(ctx, run_id)
    except NotFoundError:
        console.print(
            f"[red]error:[/] no run {run_id!r} in s3://{ctx.settings.s3_bucket}/{keys.RUNS_PREFIX}"
        )
        raise typer.Exit(1) from None
    index, outputs = runs.load_run(ctx, run_id)
    if index is None:
        console.print(
            f"[red]error:[/] run {run_id} was never ingested; fix: rsieve reconcile {run_id}"
        )
        raise typer.Exit(1)
    result = audit_run(index, outputs)
    if as_json:
        typer.echo(json.dumps(result.as_dict(), indent=1))
    else:
        table = Table(
            "family",
            *[f"{s} in/out/quar." for s in STAGES],
            title=run_id,
        )
        for fam, stages in result.families.items():
            table.add_row(
                fam,
                *[
                    "{in}/{out}/{quarantined}".format(**stages[s]) if s in stages else "-"
                    for s in STAGES
                ],
            )
        Console().print(table)
        for problem in result.problems:
            console.print(f"[red]problem:[/] {problem}")
        console.print("[green]audit holds" if result.ok else "[red]audit fails")
    raise typer.Exit(0 if result.ok else 1)


@friendly
def reconcile(run_id: Run) -> None:
    """Enqueue again every shard of RUN whose next stage output is missing (safe any time)."""
    from rsieve.errors import NotFoundError
    from services import runs

    ctx = shell.context()
    try:
        plan = runs.reconcile(ctx, run_id)
    except NotFoundError:
        console.print(f"[red]error:[/] no run {run_id!r}")
        raise typer.Exit(1) from None
    for task, kwargs in plan:
        console.print(f"enqueued {task} {kwargs.get('shard', '')}")
    console.print(f"{len(plan)} task(s) enqueued" if plan else "nothing missing")


@friendly
@takes_sampling
def run(
    pool: Pool,
    out: Annotated[Path, typer.Option(help="export folder; the dataset goes to OUT/<dataset>")],
    dataset: Dataset = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the run")] = 7200,
    sampling: dict[str, Any] | None = None,
) -> None:
    """Process a pool end to end on the local stack and export its dataset."""
    from rsieve.adapters.exports import export_dataset
    from rsieve.adapters.storage import S3Store
    from rsieve.settings import Settings
    from rsieve_cli.client import upload, wait_for_run

    try:
        stack = shell.local_stack()
        with console.status("starting the local stack"):
            stack.up()
        settings = Settings.from_env_map(stack.config.env())
        name = dataset or pool.resolve().name
        with console.status(f"uploading {pool}"):
            run_id = upload(settings, pool, name, sampling=sampling)
        console.print(f"run [bold]{run_id}[/] for pool {pool} -> dataset {name}")
        with Progress(
            TextColumn("{task.description:>9}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            bars = {s: progress.add_task(s, total=None) for s in STAGES}

            def show(status: dict) -> None:
                for stage, bar in bars.items():
                    progress.update(bar, total=status["shards"], completed=status["stages"][stage])

            final = wait_for_run(settings, run_id, timeout=timeout, on_status=show)
        target = export_dataset(S3Store(settings), name, out)  # the stack's own operator
    except (RsieveError, TimeoutError, OSError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None
    table = Table("split", "rows (images)", title=f"{target}")
    for split, rows in final["manifest"]["splits"].items():
        table.add_row(split, str(rows))
    Console().print(table)
    report = json.loads((target / "run_report.json").read_text())
    fams = Table("family", "in", "accepted", "rejected", "quarantined", title="run report")
    for fam, r in report["families"].items():
        fams.add_row(
            fam, str(r["in"]), str(r["accepted"]), str(r["rejected"]), str(r["quarantined"])
        )
    Console().print(fams)
    if not report["adds_up"]:
        console.print("[red]the run's accounting does not add up[/]; see run_report.json")
        raise typer.Exit(2)


@friendly
@takes_sampling
def submit(
    pool: Pool,
    dataset: Dataset = None,
    as_json: AsJson = False,
    sampling: dict[str, Any] | None = None,
) -> None:
    """Upload POOL through the API and submit it; prints the run id (no waiting). Needs
    only the API's address and token (RSIEVE_API_URL, RSIEVE_API_TOKEN)."""
    from rsieve.errors import PermanentError
    from rsieve_cli.client import upload

    if not pool.is_dir():
        raise Failure(f"{pool} is not a folder", "give the pool folder (items.jsonl + images)")
    if not (pool / "items.jsonl").is_file() and not any(pool.glob("*.parquet")):
        raise Failure(
            f"{pool} is not a pool: it has no items.jsonl",
            "give the folder that holds items.jsonl and its images",
        )
    shell.api("GET", "/healthz")  # fail fast, before uploading, when the stack is down
    name = dataset or pool.resolve().name
    try:
        run_id = upload(shell.settings(), pool, name, sampling=sampling)
    except PermanentError as exc:
        raise Failure(str(exc)) from None
    if as_json:
        typer.echo(json.dumps({"run": run_id, "dataset": name}))
    else:
        typer.echo(run_id)
        console.print(f"follow it with: rsieve status {run_id} --watch")


FORMATS = ("card", "messages", "dpo", "kto", "rl")

# `rsieve export`'s options, each with the formats it applies to.
ExportTo = Annotated[
    Path,
    typer.Option(
        "--to",
        help="folder; the dataset goes to TO/<dataset> (messages: TO/<dataset>-messages; "
        "dpo, kto, rl: TO/<run>-<format>[-<layout>])",
    ),
]
ExportFormat = Annotated[
    str,
    typer.Option(
        "--format",
        help="card: the dataset as published; messages: SFT rows in TRL's conversational "
        "format; dpo: preference pairs; kto: one labelled row per sample; rl: a prompt set "
        "with rewards (docs/training.md)",
    ),
]
IncludeRejected = Annotated[
    bool,
    typer.Option(
        "--include-rejected", help="messages: also a `rejected` split (the reference answers)"
    ),
]
PairMode = Annotated[
    str,
    typer.Option(help="dpo, kto: `think` (reasoning inline) or `nothink` (the answer alone)"),
]
ChosenIncludeJudged = Annotated[
    bool,
    typer.Option(
        "--chosen-include-judged",
        help="dpo, kto: judge promotions of calibrated families may be chosen",
    ),
]
RejectedRequires = Annotated[
    str,
    typer.Option(
        help="dpo, kto: not_promoted (the judge did not call it CORRECT or UNSURE) or "
        "judge_wrong (the judge called it WRONG)"
    ),
]
MaxPairsPerItem = Annotated[int, typer.Option(min=1, help="dpo: pairs kept per item")]
PairSeed = Annotated[int, typer.Option(help="dpo: the seed of the pairs' draw")]
PassRateBand = Annotated[
    tuple[float, float] | None,
    typer.Option(help="rl: keep items whose pass rate lies strictly between LOW and HIGH"),
]
Layout = Annotated[str, typer.Option(help="rl: trl, verl or easyr1")]


@friendly
def export(
    run_id: Run,
    to: ExportTo,
    fmt: ExportFormat = "card",
    include_rejected: IncludeRejected = False,
    mode: PairMode = "think",
    chosen_include_judged: ChosenIncludeJudged = False,
    rejected_requires: RejectedRequires = "not_promoted",
    max_pairs_per_item: MaxPairsPerItem = 15,
    pair_seed: PairSeed = 0,
    pass_rate_band: PassRateBand = None,
    layout: Layout = "trl",
) -> None:
    """Copy RUN's published dataset (Parquet, card, run_report.json, quarantine.jsonl), or
    write it for trainers: SFT (`messages`), preference optimisation (`dpo`, `kto`) or RL
    with verifiable rewards (`rl`)."""
    from rsieve.adapters.exports import export_dataset

    _check_export_options(fmt, include_rejected=include_rejected, band=pass_rate_band)
    ctx = shell.context()
    spec = shell.published(ctx, run_id)
    if fmt == "card":
        target = export_dataset(ctx.store, spec.dataset, to)
    elif fmt == "messages":
        target = _export_messages(ctx, spec, to, include_rejected=include_rejected)
    else:
        target = _export_training(
            ctx,
            spec,
            to,
            fmt,
            mode=mode,
            chosen_include_judged=chosen_include_judged,
            rejected_requires=rejected_requires,
            max_pairs_per_item=max_pairs_per_item,
            pair_seed=pair_seed,
            band=pass_rate_band,
            layout=layout,
        )
    typer.echo(str(target))


def _check_export_options(
    fmt: str, *, include_rejected: bool, band: tuple[float, float] | None
) -> None:
    """Refuse, before anything is read, a format rsieve has not and an option the format
    does not take."""
    if fmt not in FORMATS:
        raise Failure(f"unknown format {fmt!r}", "use --format " + ", ".join(FORMATS))
    if include_rejected and fmt != "messages":
        raise Failure(
            "--include-rejected applies to --format messages only",
            "the card format always holds the rejected splits",
        )
    if band is not None and fmt != "rl":
        raise Failure("--pass-rate-band applies to --format rl only")


def _export_messages(ctx: Any, spec: Any, to: Path, *, include_rejected: bool) -> Path:
    """The messages export: the dataset's rows in TRL's conversational format."""
    from rsieve.adapters.exports import EmptyExport, export_messages

    try:
        return export_messages(
            ctx.store,
            spec.dataset,
            to,
            include_rejected=include_rejected,
            group_rows=ctx.settings.parquet_row_group_rows,
            shard_bytes=ctx.settings.parquet_shard_bytes,
        )
    except EmptyExport as exc:
        raise Failure(str(exc), "add --include-rejected to export the rejected split") from exc


def _export_training(
    ctx: Any,
    spec: Any,
    to: Path,
    fmt: str,
    *,
    mode: str,
    chosen_include_judged: bool,
    rejected_requires: str,
    max_pairs_per_item: int,
    pair_seed: int,
    band: tuple[float, float] | None,
    layout: str,
) -> Path:
    """The dpo, kto and rl exports: the run's judged outcomes, shard by shard."""
    from rsieve.adapters.committed import run_file_key
    from rsieve.adapters.exports import EmptyExport
    from rsieve.adapters.training_exports import export_preference, export_rl
    from rsieve.dataset.preference import PairRules
    from rsieve.dataset.rlsets import LAYOUTS, Band
    from services import runs

    run = spec.run
    outcomes = (out.outcomes for out in runs.stage_outputs(ctx, run, "judge"))
    common = {
        "dataset": spec.dataset,
        "run": run,
        "sampling": spec.settings,
        "shard_bytes": ctx.settings.parquet_shard_bytes,
    }
    try:
        if fmt == "rl":
            if layout not in LAYOUTS:
                raise Failure(f"unknown layout {layout!r}", "use --layout " + ", ".join(LAYOUTS))
            policy = runs.run_settings(ctx, run).training_policy()
            return export_rl(
                ctx.store,
                outcomes,
                to,
                layout=layout,
                band=Band(*band) if band else Band(),
                training_rule_of=lambda item: policy.rule_for(item.family, item.protocol),
                **common,
            )
        rules = PairRules(
            mode=mode,  # type: ignore[arg-type]
            chosen_include_judged=chosen_include_judged,
            rejected_requires=rejected_requires,  # type: ignore[arg-type]
            max_pairs_per_item=max_pairs_per_item,
            seed=pair_seed,
        )
        report = json.loads(
            ctx.store.get(run_file_key(ctx.store, spec.dataset, run, "run_report.json"))
        )
        bound = report.get("judge_false_promotion_bound")
        return export_preference(
            ctx.store,
            outcomes,
            to,
            fmt=fmt,  # type: ignore[arg-type]
            rules=rules,
            report=report,
            bound=ctx.settings.judge_false_promotion_bound if bound is None else bound,
            **common,
        )
    except ValueError as exc:
        if isinstance(exc, EmptyExport):
            raise Failure(str(exc), "docs/training.md: what each export needs") from exc
        raise Failure(str(exc)) from exc


@friendly
def card(run_id: Run) -> None:
    """Print RUN's dataset card (README.md: rules, constants, counts, calibration)."""
    from rsieve.adapters.committed import run_file_key

    ctx = shell.context()
    spec = shell.published(ctx, run_id)
    key = run_file_key(ctx.store, spec.dataset, run_id, "README.md")
    sys.stdout.write(ctx.store.get(key).decode())
