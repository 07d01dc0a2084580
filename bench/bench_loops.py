"""What one look of the loop watch costs (rsieve.generate.loops.loop_at_end on a
2048-character tail): the generator looks once per `every_chars` (256) streamed
characters. Prints figures; asserts nothing about time (the behaviour is tested in
tests/unit/test_loops.py).

    .venv/bin/python -m bench.bench_loops
"""

from __future__ import annotations

import time

from rsieve.generate.loops import LoopRule, loop_at_end
from tests.unit.test_loops import PROSE

RULE = LoopRule()


def main() -> None:
    tails = {
        "prose": (PROSE * 3)[-2048:],
        "counting": ", ".join(str(i) for i in range(1, 700))[-2048:],
        "loop": ("Wait, let me check again. " * 100)[-2048:],
        "one char": "!" * 2048,
    }
    for name, tail in tails.items():
        n = 2000
        start = time.perf_counter()
        for _ in range(n):
            loop_at_end(tail, RULE)
        each = (time.perf_counter() - start) / n
        print(f"loop_at_end on a 2048-character tail ({name}): {each * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
