"""`rsieve recheck RUN_OR_FOLDER`: every verifier decision recomputed with rsieve.verify
(rsieve.dataset.recheck for an exported folder, rsieve.judge.cascade for a run's stored
outputs); exit 1 where any differs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from rsieve_cli import shell
from rsieve_cli.shell import Failure, console, friendly


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
        summary = recheck_folder(folder)
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
    recheck_run(target, as_json)


def recheck_folder(folder: Path) -> dict[str, Any]:
    """Read an exported dataset's rows and reports, recheck them (rsieve.dataset.recheck)."""
    import pyarrow.parquet as pq

    from rsieve.compact.splits import SPLIT_KINDS, split_name
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


def recheck_run(run_id: str, as_json: bool) -> None:
    from rsieve.judge.cascade import recheck_outcomes
    from services import runs

    ctx = shell.context()
    shell.spec_or_fail(ctx, run_id)
    outputs = list(runs.stage_outputs(ctx, run_id, "verify"))
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
