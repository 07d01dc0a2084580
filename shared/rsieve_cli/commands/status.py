"""`rsieve status [RUN]`: a run's per-stage progress (shards, items, rate, ETA, per
family), what is in flight or orphaned and why a run cannot finish; or the list of runs."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rsieve_cli import shell
from rsieve_cli.shell import friendly


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
        runs = shell.api("GET", "/runs", params={"limit": 1000})
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
    current = shell.api("GET", path)
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
            current = shell.api("GET", path)
            live.update(Group(*_status_tables(current)), refresh=True)
