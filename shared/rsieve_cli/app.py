"""`rsieve`: the command line. `run POOL --out DIR` does end to end what `make run` does
for the example pool; `stack up|down|status` manages the local stack; `submit`, `status`,
`export`, `card`, `recheck`, `audit` and `reconcile` work on runs. Errors are one line
with the fix, never a traceback; `--json` where a script reads the output."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rsieve import keys
from rsieve.errors import CorruptOutputError, NotFoundError, RetryableError, RsieveError
from rsieve.schemas import STAGES

if TYPE_CHECKING:  # imported where used: the command line starts without them
    from rsieve.settings import Settings
    from rsieve_cli.local.stack import Stack
    from services.common import Context

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False)
stack_app = typer.Typer(help="The local stack (Redis, SeaweedFS, Triton, workers, API).")
app.add_typer(stack_app, name="stack")
evalset_app = typer.Typer(
    help="Evaluation sets: pools whose images no later run may train on (docs/cleaning.md)."
)
app.add_typer(evalset_app, name="evalset")
console = Console(stderr=True)


def _stack() -> Stack:
    from rsieve_cli.local.stack import Stack, StackConfig

    state = Path(os.environ.get("RSIEVE_STACK_DIR", "var/stack")).resolve()
    saved = state / "config.json"
    if saved.is_file():  # reuse the ports and models the stack was started with
        return Stack(StackConfig.load(saved))
    return Stack(StackConfig(state_dir=state))


def _settings() -> Settings:
    """Settings for the local stack when one was started here, else from RSIEVE_* env."""
    from rsieve.settings import Settings

    state = Path(os.environ.get("RSIEVE_STACK_DIR", "var/stack")).resolve()
    if (state / "config.json").is_file():
        env = _stack().config.env()
        return Settings.from_env_map(env)
    return Settings()


def _context() -> Context:
    from services.common import bootstrap

    return bootstrap(_settings())


# --- one-line errors ----------------------------------------------------------------------

F = TypeVar("F", bound=Callable[..., Any])
STACK_FIX = "start it with `rsieve stack up` (or point RSIEVE_API_URL / RSIEVE_S3_ENDPOINT at it)"


class Failure(Exception):
    """A failure the user can fix: printed as `error: <what>; fix: <how>`, exit 1."""

    def __init__(self, what: str, fix: str | None = None) -> None:
        super().__init__(what if fix is None else f"{what}; fix: {fix}")


def friendly(fn: F) -> F:
    """Turn every expected failure of a command into one line on stderr and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import httpx

        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except Failure as exc:
            message = str(exc)
        except httpx.TransportError as exc:
            message = f"cannot reach the API ({type(exc).__name__}: {exc}); fix: {STACK_FIX}"
        except RetryableError as exc:
            message = f"storage or queue unreachable ({exc}); fix: {STACK_FIX}"
        except CorruptOutputError as exc:
            message = (
                f"a stored output was corrupt ({exc}): it was moved aside and its stage is "
                "being redone; fix: run this again once `rsieve status` shows the run done"
            )
        except (RsieveError, OSError, TimeoutError) as exc:
            message = str(exc) or type(exc).__name__
        except Exception as exc:
            if type(exc).__module__.split(".")[0] in ("redis", "botocore", "kombu"):
                message = f"{type(exc).__name__}: {exc}; fix: {STACK_FIX}"
            else:
                raise
        console.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)

    return wrapper  # type: ignore[return-value]


def _api(method: str, path: str, **kwargs: Any) -> Any:
    """Call the API with the configured token; HTTP errors become Failures with a fix."""
    from rsieve_cli.client import api_request

    s = _settings()
    resp = api_request(s, method, path, **kwargs)
    if resp.status_code == 401:
        raise Failure(
            f"the API at {s.api_url} refused the token", "set RSIEVE_API_TOKEN to the API's token"
        )
    if resp.status_code >= 400:
        try:
            detail = resp.json().get("detail")
        except ValueError:
            detail = resp.text[:300]
        fix = {
            404: "`rsieve status` lists the runs",
            409: "wait until `rsieve status RUN` says done",
        }.get(resp.status_code)
        raise Failure(f"{detail if isinstance(detail, str) else json.dumps(detail)}", fix)
    return resp.json()


def _spec_or_fail(ctx: Any, run_id: str) -> Any:
    try:
        return ctx.spec(run_id)
    except NotFoundError:
        raise Failure(
            f"no run {run_id!r} in s3://{ctx.settings.s3_bucket}/{keys.RUNS_PREFIX}",
            "`rsieve status` lists the runs",
        ) from None


@app.command()
@friendly
def audit(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="run id")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Prove from storage that every item of RUN ended in exactly one place (exit 0 if so)."""
    from rsieve.dataset.audit import audit_run
    from rsieve.errors import NotFoundError

    ctx = _context()
    try:
        ctx.spec(run_id)
    except NotFoundError:
        console.print(
            f"[red]error:[/] no run {run_id!r} in s3://{ctx.settings.s3_bucket}/{keys.RUNS_PREFIX}"
        )
        raise typer.Exit(1) from None
    index, outputs = ctx.load_run(run_id)
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


@app.command()
@friendly
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
    console.print(
        f"API {stack.config.env()['RSIEVE_API_URL']}: its bearer token is `api_token` in "
        f"{stack.dir / 'config.json'} (the review page at /review asks for it)"
    )


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


@evalset_app.command("add")
@friendly
def evalset_add(
    name: Annotated[str, typer.Argument(help="the set's name (letters, digits, . _ -)")],
    pool: Annotated[Path, typer.Argument(help="the evaluation pool, in any pool format")],
) -> None:
    """Register POOL as evaluation set NAME (replacing one of that name): every later run
    quarantines an item whose image matches one of its images as `contaminated`."""
    from rsieve.adapters.pools import read_pool
    from rsieve.clean.decontam import build_evalset

    files = read_pool(pool)

    def image_bytes(path: str) -> bytes | None:
        return files.read(path) if path in files.files else None

    try:
        evalset, figures = build_evalset(name, files.items, image_bytes)
    except ValueError as exc:
        raise Failure(str(exc)) from None
    _context().store.put(keys.evalset(name), evalset.to_json(), content_type="application/json")
    console.print(
        f"evaluation set {name}: {figures['hashed']} of {figures['lines']} lines hashed "
        f"({len({h for h, _ in evalset.items})} hashes: each image and two crops of it); "
        f"{figures['left_out']} left out (no readable image)"
    )


@evalset_app.command("list")
@friendly
def evalset_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The registered evaluation sets and their sizes."""
    from rsieve.clean.decontam import EvalSet

    store = _context().store
    sets = [
        EvalSet.from_json(store.get(k))
        for k in store.list(keys.EVALSETS_PREFIX)
        if keys.evalset_name(k) is not None
    ]
    rows = [
        {"name": es.name, "keys": len(es.items), "hashes": len({h for h, _ in es.items})}
        for es in sets
    ]
    if as_json:
        typer.echo(json.dumps(rows))
        return
    table = Table("evaluation set", "keys (hash, question)", "hashes")
    for row in rows:
        table.add_row(str(row["name"]), str(row["keys"]), str(row["hashes"]))
    Console().print(table)


@evalset_app.command("remove")
@friendly
def evalset_remove(name: Annotated[str, typer.Argument(help="the set's name")]) -> None:
    """Stop checking runs against evaluation set NAME (runs already made keep their
    decisions; the next submission of a pool is a new run)."""
    store = _context().store
    if not store.exists(keys.evalset(name)):
        raise Failure(f"no evaluation set {name!r}", "`rsieve evalset list` shows them")
    store.delete(keys.evalset(name))
    console.print(f"evaluation set {name} removed")


def _print_status(status: dict[str, int | None]) -> None:
    table = Table("process", "pid", "state")
    for name, pid in status.items():
        table.add_row(name, str(pid or "-"), "[green]running" if pid else "[red]stopped")
    console.print(table)


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
Window = Annotated[
    str | None,
    typer.Option(help="LOW,HIGH: keep accepted items whose pass rate lies within (e.g. 0.2,0.8)"),
]


def _sampling(
    samples: int | None,
    temperature: float | None,
    seed: int | None,
    keep: str | None,
    max_kept: int | None,
    window: str | None = None,
    circular: bool | None = None,
    blind_pass: bool | None = None,
    blind_policy: str | None = None,
) -> dict[str, Any] | None:
    """The run's own sampling, as the API takes it (only what was given)."""
    try:
        bounds = [float(x) for x in window.split(",")] if window else None
    except ValueError:
        raise Failure(f"--pass-rate-window {window!r}", "give LOW,HIGH, e.g. 0.2,0.8") from None
    chosen = {
        "samples": samples,
        "temperature": temperature,
        "seed": seed,
        "keep": keep,
        "max_kept": max_kept,
        "pass_rate_window": bounds,
        "circular": circular,
        "blind_pass": blind_pass,
        "blind_policy": blind_policy,
    }
    return {k: v for k, v in chosen.items() if v is not None} or None


@app.command()
@friendly
def run(
    pool: Annotated[Path, typer.Argument(help="pool folder with items.jsonl and images")],
    out: Annotated[Path, typer.Option(help="export folder; the dataset goes to OUT/<dataset>")],
    dataset: Annotated[str | None, typer.Option(help="dataset name (default: pool folder)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the run")] = 7200,
    samples: Samples = None,
    temperature: Temperature = None,
    seed: Seed = None,
    keep: Keep = None,
    max_kept: MaxKept = None,
    pass_rate_window: Window = None,
    circular: Circular = None,
    blind_pass: BlindPass = None,
    blind_policy: BlindPolicy = None,
) -> None:
    """Process a pool end to end on the local stack and export its dataset."""
    from rsieve.adapters.exports import export_dataset
    from rsieve.adapters.storage import S3Store
    from rsieve.settings import Settings
    from rsieve_cli.client import upload, wait_for_run

    try:
        stack = _stack()
        with console.status("starting the local stack"):
            stack.up()
        settings = Settings.from_env_map(stack.config.env())
        name = dataset or pool.resolve().name
        with console.status(f"uploading {pool}"):
            run_id = upload(
                settings,
                pool,
                name,
                sampling=_sampling(
                    samples,
                    temperature,
                    seed,
                    keep,
                    max_kept,
                    pass_rate_window,
                    circular,
                    blind_pass,
                    blind_policy,
                ),
            )
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


@app.command("submit")
@friendly
def submit_pool(
    pool: Annotated[Path, typer.Argument(help="pool folder with items.jsonl and images")],
    dataset: Annotated[str | None, typer.Option(help="dataset name (default: pool folder)")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    samples: Samples = None,
    temperature: Temperature = None,
    seed: Seed = None,
    keep: Keep = None,
    max_kept: MaxKept = None,
    pass_rate_window: Window = None,
    circular: Circular = None,
    blind_pass: BlindPass = None,
    blind_policy: BlindPolicy = None,
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
    _api("GET", "/healthz")  # fail fast, before uploading, when the stack is down
    name = dataset or pool.resolve().name
    try:
        run_id = upload(
            _settings(),
            pool,
            name,
            sampling=_sampling(
                samples,
                temperature,
                seed,
                keep,
                max_kept,
                pass_rate_window,
                circular,
                blind_pass,
                blind_policy,
            ),
        )
    except PermanentError as exc:
        raise Failure(str(exc)) from None
    if as_json:
        typer.echo(json.dumps({"run": run_id, "dataset": name}))
    else:
        typer.echo(run_id)
        console.print(f"follow it with: rsieve status {run_id} --watch")


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else (f"{seconds // 60}m{seconds % 60:02d}s")
    )


def _fmt_flight(p: dict[str, Any]) -> str:
    n, orphans = p.get("in_flight", 0), p.get("orphaned", 0)
    return f"{n} ({orphans} orphaned)" if orphans else str(n) if n else "-"


def _liveness_tables(status: dict[str, Any]) -> list[Table]:
    """Shards held now (holder, age), orphaned shards requeued, failed shards, and why
    the run cannot finish (GET /runs/RUN, docs/operations.md)."""
    tables = []
    held = [(stage, f) for stage, fs in status.get("in_flight", {}).items() for f in fs]
    if held:
        t = Table("stage", "shard", "holder", "age", "state", title="shards in flight")
        for stage, f in held:
            state = "[red]orphaned: requeue pending[/]" if f["orphaned"] else "running"
            t.add_row(stage, str(f["shard"]), f["holder"], f"{f['age_s']:.0f}s", state)
        tables.append(t)
    orphaned = status.get("orphaned", [])
    if orphaned:
        t = Table(
            "stage",
            "shard",
            "dead holder",
            "held",
            "requeued",
            title=f"{len(orphaned)} shard(s) orphaned by a dead worker and requeued",
        )
        for o in orphaned[-20:]:
            when = time.strftime("%H:%M:%S", time.localtime(o.get("requeued_at", 0)))
            how = when if o.get("requeued", True) else f"{when} (already back)"
            t.add_row(
                str(o.get("stage")),
                str(o.get("shard")),
                str(o.get("holder")),
                f"{o.get('held_s', 0):.0f}s",
                how,
            )
        tables.append(t)
    failed = status.get("failed", [])
    if failed:
        t = Table("shard", "reason", title=f"{len(failed)} shard(s) failed")
        for f in failed:
            t.add_row(str(f["shard"]), str(f["reason"]))
        tables.append(t)
    if status.get("cannot_finish"):
        t = Table("the run cannot finish", title="[red]stalled[/]")
        t.add_row(str(status["cannot_finish"]))
        tables.append(t)
    return tables


def _status_tables(status: dict[str, Any]) -> list[Table]:
    total = status["shards"]
    stages = Table(
        "stage",
        "progress",
        "shards",
        "items",
        "items/s",
        "in flight",
        "ETA",
        title=f"{status['run']} ({'done' if status['done'] else 'running'})",
    )
    for stage, p in status["progress"].items():
        done = p["shards_done"]
        width = 20
        filled = int(width * done / total) if total else 0
        bar = "[green]" + "█" * filled + "[/][dim]" + "░" * (width - filled) + "[/]"
        stages.add_row(
            stage,
            bar,
            f"{done}/{total if total is not None else '?'}",
            str(p["items"]) if p["items"] is not None else "-",
            f"{p['rate_items_s']:.1f}" if p["rate_items_s"] is not None else "-",
            _fmt_flight(p),
            _fmt_eta(p["eta_s"]),
        )
    families = sorted({f for p in status["progress"].values() for f in p["families"]})
    per_family = Table("family", *status["progress"], title="items per family and stage")
    for fam in families:
        per_family.add_row(
            fam, *[str(p["families"].get(fam, 0)) for p in status["progress"].values()]
        )
    return [*([stages, per_family] if families else [stages]), *_liveness_tables(status)]


@app.command()
@friendly
def status(
    run_id: Annotated[
        str | None, typer.Argument(metavar="[RUN]", help="run id (none: list)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    watch: Annotated[bool, typer.Option("--watch", help="refresh until the run is done")] = False,
    interval: Annotated[float, typer.Option(help="seconds between refreshes")] = 1.0,
) -> None:
    """Per-stage progress of RUN (shards, items, rate, ETA, per family), or list the runs."""
    from urllib.parse import quote

    if run_id is None:
        runs = _api("GET", "/runs", params={"limit": 1000})
        if as_json:
            typer.echo(json.dumps(runs))
            return
        table = Table("run", "dataset", "submitted", title=f"{runs['count']} run(s)")
        for r in runs["data"]:
            when = (
                time.strftime("%Y-%m-%d %H:%M", time.localtime(r["submitted_at"]))
                if r.get("submitted_at")
                else "-"
            )
            table.add_row(r["run"], r["dataset"], when)
        Console().print(table)
        return
    path = f"/runs/{quote(run_id, safe='')}"
    current = _api("GET", path)
    if as_json:
        typer.echo(json.dumps(current))
        return
    if not watch:
        for table in _status_tables(current):
            Console().print(table)
        return
    from rich.console import Group
    from rich.live import Live

    with Live(Group(*_status_tables(current)), console=Console(), auto_refresh=False) as live:
        while not current["done"]:
            time.sleep(interval)
            current = _api("GET", path)
            live.update(Group(*_status_tables(current)), refresh=True)


def _published(ctx: Any, run_id: str) -> Any:
    from rsieve.adapters.exports import run_manifest

    spec = _spec_or_fail(ctx, run_id)
    if run_manifest(ctx.store, spec.dataset, run_id) is None:
        raise Failure(
            f"run {run_id} is not committed to dataset {spec.dataset} yet",
            f"wait until `rsieve status {run_id}` says done",
        )
    return spec


@app.command("export")
@friendly
def export_run(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="run id")],
    to: Annotated[
        Path,
        typer.Option(
            "--to",
            help="folder; the dataset goes to TO/<dataset> (messages: TO/<dataset>-messages)",
        ),
    ],
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="card: the dataset as published; messages: one row per question in TRL's "
            "conversational format, splits think/nothink (docs/operations.md)",
        ),
    ] = "card",
    include_rejected: Annotated[
        bool,
        typer.Option(
            "--include-rejected", help="messages: also a `rejected` split (the reference answers)"
        ),
    ] = False,
) -> None:
    """Copy RUN's published dataset (Parquet, card, run_report.json, quarantine.jsonl), or
    write it for trainers (`--format messages`)."""
    from rsieve.adapters.exports import EmptyExport, export_dataset, export_messages

    if fmt not in ("card", "messages"):
        raise Failure(f"unknown format {fmt!r}", "use --format card or --format messages")
    if include_rejected and fmt != "messages":
        raise Failure(
            "--include-rejected applies to --format messages only",
            "the card format always holds the rejected splits",
        )
    ctx = _context()
    spec = _published(ctx, run_id)
    if fmt == "card":
        target = export_dataset(ctx.store, spec.dataset, to)
    else:
        try:
            target = export_messages(
                ctx.store,
                spec.dataset,
                to,
                include_rejected=include_rejected,
                group_rows=ctx.settings.parquet_row_group_rows,
                shard_bytes=ctx.settings.parquet_shard_bytes,
            )
        except EmptyExport as exc:
            raise Failure(str(exc), "add --include-rejected to export the rejected split") from exc
    typer.echo(str(target))


@app.command()
@friendly
def card(run_id: Annotated[str, typer.Argument(metavar="RUN", help="run id")]) -> None:
    """Print RUN's dataset card (README.md: rules, constants, counts, calibration)."""
    ctx = _context()
    spec = _published(ctx, run_id)
    from rsieve.adapters.exports import run_file_key

    key = run_file_key(ctx.store, spec.dataset, run_id, "README.md")
    sys.stdout.write(ctx.store.get(key).decode())


@app.command()
@friendly
def recheck(
    target: Annotated[
        str, typer.Argument(metavar="RUN_OR_FOLDER", help="run id, or an exported dataset folder")
    ],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Recompute every verifier decision with rsieve.verify and say where any differs
    (exit 1). A folder (what `rsieve export` wrote, or a downloaded copy of the dataset):
    from its files alone, no stack, the judge hold-back and training targets included. A
    run id: from the run's stored outputs on the stack."""
    folder = Path(target)
    if folder.is_dir():
        summary = _recheck_folder(folder)
        if as_json:
            typer.echo(json.dumps({"folder": str(folder), **summary}))
        else:
            for d in summary["differences"]:
                console.print(f"[red]differs:[/] {json.dumps(d)}", highlight=False, soft_wrap=True)
            typer.echo(
                f"{summary['decisions']} decision(s) rechecked, {summary['agreed']} agree "
                f"({summary['agreement']:.2%}); {summary['hold_back_checked']} judge "
                f"promotion(s) checked against the hold-back; "
                f"{len(summary['differences'])} difference(s)"
            )
        raise typer.Exit(1 if summary["differences"] else 0)
    _recheck_run(target, as_json)


def _recheck_folder(folder: Path) -> dict[str, Any]:
    """Read an exported dataset's rows and reports, recheck them (rsieve.dataset.recheck)."""
    import pyarrow.parquet as pq

    from rsieve.compact.rows import SPLIT_KINDS, split_name
    from rsieve.dataset.recheck import RecheckResult, recheck_entries

    shards = sorted((folder / "data").glob("*.parquet"))
    if not shards:
        raise Failure(f"{folder} holds no data/*.parquet", "give the folder `rsieve export` wrote")
    reports: dict[str, dict[str, Any]] = {}
    for path in [*sorted((folder / "reports").glob("*.json")), folder / "run_report.json"]:
        if path.is_file():
            report = json.loads(path.read_text())
            reports[report.get("run", path.stem)] = report
    spec_path = folder / "run_spec.json"
    spec = json.loads(spec_path.read_text()) if spec_path.is_file() else {}
    total = RecheckResult()
    by_run: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path in shards:
        for row in pq.read_table(path, columns=["qa", "clean_meta"]).to_pylist():
            run = row["clean_meta"]["run"]
            families = (reports.get(run) or {}).get("families", {})
            split = path.name.split(f"-{run}-")[0]  # data/<split>-<run>-<i>-of-<n>.parquet
            kind = next(k for k in SPLIT_KINDS if split.endswith("_" + k))
            family = next(
                (f for f in families if split_name(f, kind) == split), split[: -len(kind) - 1]
            )
            by_run.setdefault(run, []).extend((kind, family, qa) for qa in row["qa"])
    for run, entries in sorted(by_run.items()):
        report = reports.get(run) or {}
        bound = report.get("judge_false_promotion_bound")
        if bound is None and spec.get("run") == run:
            bound = spec.get("judge_false_promotion_bound")
        part = recheck_entries(
            entries,
            calibration=report.get("calibration"),
            bound=bound,
            trace_gate=report.get("trace_gate"),
            blind_policy=_blind_policy(spec) if spec.get("run") == run else None,
        )
        total.decisions += part.decisions
        total.agreed += part.agreed
        total.hold_back_checked += part.hold_back_checked
        total.traces_checked += part.traces_checked
        total.differences += [d | {"run": run} for d in part.differences]
    return total.summary()


def _blind_policy(spec: dict[str, Any]) -> str | None:
    """The run's blind_policy when it ran the blind pass (run_spec.json's settings)."""
    settings = spec.get("settings") or {}
    return settings.get("blind_policy") if settings.get("blind_pass") else None


def _recheck_run(run_id: str, as_json: bool) -> None:
    from rsieve.judge.cascade import recheck_outcomes

    ctx = _context()
    _spec_or_fail(ctx, run_id)
    outputs = [
        ctx.load(run_id, "verify", shard) for shard in sorted(ctx.stored_shards(run_id, "verify"))
    ]
    if not outputs:
        raise Failure(
            f"run {run_id} has no verifier output yet",
            f"wait until `rsieve status {run_id}` shows verify shards",
        )
    checked, diffs = recheck_outcomes(o for out in outputs for o in out.verified)
    if as_json:
        typer.echo(json.dumps({"run": run_id, "checked": checked, "differences": diffs}))
    else:
        for d in diffs:
            console.print(
                f"[red]differs:[/] {d['id']} ({d['family']}, line {d['line']}): "
                f"stored {d['stored']} recomputed {d['recomputed']}",
                highlight=False,
                soft_wrap=True,
            )
        typer.echo(f"{checked} decision(s) rechecked, {len(diffs)} differ")
    raise typer.Exit(1 if diffs else 0)


if __name__ == "__main__":
    app()
