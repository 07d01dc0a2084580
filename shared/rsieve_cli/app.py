"""`rsieve`: the command line. `run POOL --out DIR` does end to end what `make run` does
for the example pool; `stack up|down|status` manages the local stack; `submit`, `status`,
`export`, `card`, `recheck`, `audit` and `reconcile` work on runs. Errors are one line
with the fix, never a traceback; `--json` where a script reads the output.

Every command is registered here; each is written in rsieve_cli.commands, on what
rsieve_cli.shell gives them all (the stack, the settings, the API, one-line errors)."""

from __future__ import annotations

import typer

from rsieve_cli.commands import evalset, recheck, runs, stack, status

app = typer.Typer(help=__doc__.split("\n\n")[0], no_args_is_help=True, add_completion=False)
app.add_typer(stack.app, name="stack")
app.add_typer(evalset.app, name="evalset")
app.command()(runs.audit)
app.command()(runs.reconcile)
app.command()(runs.run)
app.command("submit")(runs.submit)
app.command()(status.status)
app.command("export")(runs.export)
app.command()(runs.card)
app.command()(recheck.recheck)

if __name__ == "__main__":
    app()
