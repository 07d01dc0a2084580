"""`rsieve`: the command line. `run POOL --out DIR` does end to end what `make run` does
for the example pool; `stack up|down|status` manages the local stack."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rsieve.errors import RsieveError

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False)
stack_app = typer.Typer(help="The local stack (Redis, SeaweedFS, Triton, workers, API).")
app.add_typer(stack_app, name="stack")
console = Console(stderr=True)


def _stack():  # type: ignore[no-untyped-def]
    from rsieve.local.stack import Stack, StackConfig

    state = Path(os.environ.get("RSIEVE_STACK_DIR", "var/stack")).resolve()
    saved = state / "config.json"
    if saved.is_file():  # reuse the ports and models the stack was started with
        return Stack(StackConfig.load(saved))
    return Stack(StackConfig(state_dir=state))


def _settings():  # type: ignore[no-untyped-def]
    """Settings for the local stack when one was started here, else from RSIEVE_* env."""
    from rsieve.settings import Settings

    state = Path(os.environ.get("RSIEVE_STACK_DIR", "var/stack")).resolve()
    if (state / "config.json").is_file():
        env = _stack().config.env()
        return Settings.from_env_map(env)
    return Settings()


def _context():  # type: ignore[no-untyped-def]
    from services.common import bootstrap

    return bootstrap(_settings())


@app.command()
def audit(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="run id")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Prove from storage that every item of RUN ended in exactly one place (exit 0 if so)."""
    from rsieve.audit import audit_run
    from rsieve.errors import NotFoundError

    ctx = _context()
    try:
        ctx.spec(run_id)
    except NotFoundError:
        console.print(f"[red]error:[/] no run {run_id!r} in s3://{ctx.settings.s3_bucket}/runs/")
        raise typer.Exit(1) from None
    index, outputs = ctx.load_run(run_id)
    if index is None:
        console.print(f"[red]error:[/] run {run_id} was never ingested; "
                      f"fix: rsieve reconcile {run_id}")
        raise typer.Exit(1)
    result = audit_run(index, outputs)
    if as_json:
        typer.echo(json.dumps(result.as_dict(), indent=1))
    else:
        table = Table("family", *[f"{s} in/out/quar." for s in ("clean", "generate", "verify",
                                                               "judge")], title=run_id)
        for fam, stages in result.families.items():
            table.add_row(fam, *[
                "{in}/{out}/{quarantined}".format(**stages[s]) if s in stages else "-"
                for s in ("clean", "generate", "verify", "judge")])
        Console().print(table)
        for problem in result.problems:
            console.print(f"[red]problem:[/] {problem}")
        console.print("[green]audit holds" if result.ok else "[red]audit fails")
    raise typer.Exit(0 if result.ok else 1)


@app.command()
def reconcile(run_id: Annotated[str, typer.Argument(metavar="RUN", help="run id")]) -> None:
    """Enqueue again every shard of RUN whose next stage output is missing (safe any time)."""
    from rsieve.errors import NotFoundError

    ctx = _context()
    try:
        plan = ctx.reconcile(run_id)
    except NotFoundError:
        console.print(f"[red]error:[/] no run {run_id!r}")
        raise typer.Exit(1) from None
    for task, kwargs in plan:
        console.print(f"enqueued {task} {kwargs.get('shard', '')}")
    console.print(f"{len(plan)} task(s) enqueued" if plan else "nothing missing")


@stack_app.command("up")
def stack_up() -> None:
    """Start every process of the local stack that is not running."""
    stack = _stack()
    with console.status("starting the local stack"):
        stack.up()
    _print_status(stack.status())


@stack_app.command("down")
def stack_down() -> None:
    """Stop the local stack."""
    _stack().down()
    console.print("stack stopped")


@stack_app.command("status")
def stack_status(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Which processes of the local stack are running."""
    status = _stack().status()
    if as_json:
        typer.echo(json.dumps(status))
    else:
        _print_status(status)


def _print_status(status: dict[str, int | None]) -> None:
    table = Table("process", "pid", "state")
    for name, pid in status.items():
        table.add_row(name, str(pid or "-"), "[green]running" if pid else "[red]stopped")
    console.print(table)


@app.command()
def run(
    pool: Annotated[Path, typer.Argument(help="pool folder with items.jsonl and images")],
    out: Annotated[Path, typer.Option(help="export folder; the dataset goes to OUT/<dataset>")],
    dataset: Annotated[str | None, typer.Option(help="dataset name (default: pool folder)")]
    = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the run")] = 7200,
) -> None:
    """Process a pool end to end on the local stack and export its dataset."""
    from rsieve.adapters.storage import S3Store
    from rsieve.client import export_dataset, submit, upload_pool, wait_for_run
    from rsieve.settings import Settings

    try:
        stack = _stack()
        with console.status("starting the local stack"):
            stack.up()
        settings = Settings.from_env_map(stack.config.env())
        name = dataset or pool.resolve().name
        store = S3Store(settings)
        with console.status(f"uploading {pool}"):
            uri = upload_pool(store, pool)
        run_id = submit(settings.api_url, uri, name)
        console.print(f"run [bold]{run_id}[/] for pool {pool} -> dataset {name}")
        with Progress(TextColumn("{task.description:>9}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console) as progress:
            bars = {s: progress.add_task(s, total=None)
                    for s in ("clean", "generate", "verify", "judge")}

            def show(status: dict) -> None:  # type: ignore[type-arg]
                for stage, bar in bars.items():
                    progress.update(bar, total=status["shards"], completed=status["stages"][stage])

            final = wait_for_run(settings.api_url, run_id, timeout=timeout, on_status=show)
        target = export_dataset(store, name, out)
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
        fams.add_row(fam, str(r["in"]), str(r["accepted"]), str(r["rejected"]),
                     str(r["quarantined"]))
    Console().print(fams)
    if not report["adds_up"]:
        console.print("[red]the run's accounting does not add up[/]; see run_report.json")
        raise typer.Exit(2)


if __name__ == "__main__":
    app()
