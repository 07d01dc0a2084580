"""`rsieve evalset add|list|remove`: evaluation sets, pools whose images no later run may
train on (docs/cleaning.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rsieve import keys
from rsieve_cli import shell
from rsieve_cli.shell import Failure, console, friendly

app = typer.Typer(
    help="Evaluation sets: pools whose images no later run may train on (docs/cleaning.md)."
)


@app.command("add")
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
    shell.context().store.put(
        keys.evalset(name), evalset.to_json(), content_type="application/json"
    )
    console.print(
        f"evaluation set {name}: {figures['hashed']} of {figures['lines']} lines hashed "
        f"({len({h for h, _ in evalset.items})} hashes: each image and 10 light crops of it); "
        f"{figures['left_out']} left out (no readable image)"
    )


@app.command("list")
@friendly
def evalset_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The registered evaluation sets and their sizes."""
    from rsieve.clean.decontam import EvalSet

    store = shell.context().store
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


@app.command("remove")
@friendly
def evalset_remove(name: Annotated[str, typer.Argument(help="the set's name")]) -> None:
    """Stop checking runs against evaluation set NAME (runs already made keep their
    decisions; the next submission of a pool is a new run)."""
    store = shell.context().store
    if not store.exists(keys.evalset(name)):
        raise Failure(f"no evaluation set {name!r}", "`rsieve evalset list` shows them")
    store.delete(keys.evalset(name))
    console.print(f"evaluation set {name} removed")
