"""`rsieve stack up|down|status`: the local stack (Redis, SeaweedFS, Triton, workers, API)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from rsieve_cli.shell import console, local_stack

app = typer.Typer(help="The local stack (Redis, SeaweedFS, Triton, workers, API).")


def print_status(status: dict[str, int | None]) -> None:
    table = Table("process", "pid", "state")
    for name, pid in status.items():
        table.add_row(name, str(pid or "-"), "[green]running" if pid else "[red]stopped")
    console.print(table)


@app.command("up")
def stack_up() -> None:
    """Start every process of the local stack that is not running."""
    stack = local_stack()
    with console.status("starting the local stack"):
        stack.up()
    print_status(stack.status())
    console.print(
        f"API {stack.config.env()['RSIEVE_API_URL']}: its bearer token is `api_token` in "
        f"{stack.dir / 'config.json'} (the review page at /review asks for it)"
    )


@app.command("down")
def stack_down() -> None:
    """Stop the local stack."""
    local_stack().down()
    console.print("stack stopped")


@app.command("status")
def stack_status(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Which processes of the local stack are running."""
    status = local_stack().status()
    if as_json:
        typer.echo(json.dumps(status))
    else:
        print_status(status)
