"""Do rsieve's RL rewards (rsieve.rewards: TRL, verl, EasyR1) agree with the factory on a
run's stored samples? Re-scores every judged sample's raw output under its run's training
rule and prints, per interface, the samples scored, agreed and skipped for an unparseable
reference; `cut` counts the samples whose reward changes when a trainer cannot say the
completion was cut at the length limit. Exit 1 on any disagreement.

    .venv/bin/python -m scripts.reward_parity RUN [RUN ...]

Reads the stack the command line reaches (`rsieve_cli.shell.settings`) through the
services' own context, as a worker would.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from rsieve.rewards import INTERFACES, Parity, disagreements
from rsieve_cli.shell import settings

if TYPE_CHECKING:
    from services.context import Context

SHOWN = 20  # differing samples printed per run


def context() -> Context:
    from services.worker import bootstrap

    return bootstrap(settings())


def run_parity(ctx: Context, run: str) -> Parity:
    """Every judged sample of `run` under the run's own training rules."""
    policy = ctx.run_settings(run).training_policy()
    outcomes = [
        outcome
        for shard in sorted(ctx.stored_shards(run, "judge"))
        for outcome in ctx.load(run, "judge", shard).outcomes
    ]
    return disagreements(outcomes, lambda item: policy.rule_for(item.family, item.protocol))


def main(runs: list[str]) -> int:
    if not runs:
        print(__doc__, file=sys.stderr)
        return 2
    ctx = context()
    failed = False
    print(
        f"{'run':<24} {'interface':<9} {'scored':>8} {'agreed':>8} {'unparseable':>11} {'cut':>6}"
    )
    for run in runs:
        parity = run_parity(ctx, run)
        for name in INTERFACES:
            c = parity.counts[name]
            print(
                f"{run[:24]:<24} {name:<9} {c.scored:>8} {c.agreed:>8} {c.unparseable:>11} "
                f"{parity.stop_sensitive:>6}"
            )
        for d in parity.differing[:SHOWN]:
            print(
                f"  differs: {d.id} sample {d.sample} {d.interface}: reward {d.reward}, "
                f"factory {'accepts' if d.factory else 'rejects'}"
            )
        if len(parity.differing) > SHOWN:
            print(f"  ... and {len(parity.differing) - SHOWN} more")
        failed = failed or not parity.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
