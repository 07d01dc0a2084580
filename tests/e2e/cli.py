"""The operator's command line (`python -m rsieve_cli.app`) run on a test stack, as a user
runs it: in a subprocess, the stack found through RSIEVE_STACK_DIR."""

from __future__ import annotations

import os
import subprocess
import sys

from rsieve_cli.local.stack import REPO_ROOT, Stack


def run_cli(
    stack: Stack, *args: str, timeout: float = 900, **env_vars: str
) -> subprocess.CompletedProcess[str]:
    """`rsieve ARGS` against `stack`, output captured; COLUMNS wide enough that rich does
    not fold the tables the tests read."""
    env = {**os.environ, "RSIEVE_STACK_DIR": str(stack.dir), "COLUMNS": "160", **env_vars}
    return subprocess.run(
        [sys.executable, "-m", "rsieve_cli.app", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
        cwd=REPO_ROOT,
    )


def run_script(
    stack: Stack, module: str, *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` (a script of scripts/) against `stack`, output captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env={**os.environ, "RSIEVE_STACK_DIR": str(stack.dir)},
        text=True,
        capture_output=True,
        timeout=timeout,
        cwd=REPO_ROOT,
    )
