"""A worker shaped like the generator's for tests/e2e/test_broker_restart.py: the app of
`make_celery`, two prefork children, and one `rsieve.generate` task that holds its message
for `RSIEVE_TEST_HOLD_S` seconds. Each start and finish is a file in `RSIEVE_TEST_MARKS`
(a child killed mid-task leaves only its start)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from rsieve.adapters.queues import make_celery
from rsieve.settings import get_settings

app = make_celery(get_settings())
_MARKS = Path(os.environ.get("RSIEVE_TEST_MARKS", "."))


@app.task(name="rsieve.generate")
def generate(run: str, shard: str, lines: int) -> None:
    stamp = f"{shard}-{os.getpid()}-{time.monotonic_ns()}"
    (_MARKS / f"start-{stamp}").touch()
    time.sleep(float(os.environ.get("RSIEVE_TEST_HOLD_S", "3")))
    (_MARKS / f"done-{stamp}").touch()
