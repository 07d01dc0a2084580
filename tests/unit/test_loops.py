"""rsieve.generate.loops: what counts as a repetition loop at the end of a streamed output,
and what does not (prose, counting, tables, a loop long past)."""

from __future__ import annotations

import pytest

from rsieve.generate.loops import LoopRule, LoopWatch, loop_at_end

RULE = LoopRule()  # the settings' defaults: 2048 window, 4 repeats, 160 characters

PROSE = """The image shows a street corner in the late afternoon. A red stop sign stands on a
metal pole to the left, slightly tilted, and behind it a brick building with three
windows on the first floor. The second window is open; a curtain hangs out of it.

To answer the question I need the number on the plate below the sign. The plate is
small, but the digits are legible: a seven, then a hyphen, then four and two. The
letter before them looks like an X, though the lower stroke is partly hidden.

Checking the options again: (A) X7-42, (B) X1-42, (C) Y7-42, (D) X7-24. Only the first
matches what I read, and the second would need a one where I clearly see a seven.
Therefore the answer is (A).
"""

REASONING = """Okay, so the question asks which of the four shapes has the largest area. Let me
start with the circle: its radius is labelled 3, so its area is pi times 9, about 28.3.
The square next to it has a side of 5, which gives 25. Hmm, the triangle is a right
triangle with legs 6 and 8, so half of 48 is 24. The rectangle is 4 by 7, which is 28.

Wait, the circle and the rectangle are close. Let me double-check the circle: 3.14159
times 9 is 28.27, which is more than 28. So the circle wins, but only just. Let me also
make sure I read the rectangle's sides right; the label on the long side says 7, and the
short side says 4. Yes. So the answer is the circle, option (C).
"""

TABLE = "| item | count | price |\n|---|---|---|\n" + "".join(
    f"| widget {i} | {i * 3} | {i * 1.25:.2f} |\n" for i in range(1, 60)
)


def test_a_unit_repeated_at_the_end_is_found_with_its_length_and_cover() -> None:
    unit = "Wait, let me check again. "
    text = PROSE + unit * 10
    found = loop_at_end(text, RULE)
    assert found is not None
    assert found == (len(unit), len(unit) * 10)  # PROSE ends in a newline, the unit in a space
    # A repeat that starts with a part of the unit covers that part too.
    found = loop_at_end(PROSE + unit[-7:] + unit * 10, RULE)
    assert found == (len(unit), len(unit) * 10 + 7)


def test_a_loop_cut_mid_unit_is_still_a_loop() -> None:
    unit = "Let me re-read the question. "
    found = loop_at_end(PROSE + unit * 9 + unit[:11], RULE)
    assert found is not None and found[0] == len(unit)


@pytest.mark.parametrize(
    "text",
    [
        PROSE,
        REASONING,
        ", ".join(str(i) for i in range(1, 401)),  # counting: "1, 2, 3, ..., 400"
        TABLE,
        "\n".join(f"Step {i}: add {i} to the total, giving {i * (i + 1) // 2}." for i in range(80)),
    ],
    ids=["prose", "reasoning", "counting", "table", "steps"],
)
def test_text_that_does_not_repeat_never_fires(text: str) -> None:
    assert loop_at_end(text, RULE) is None


def test_below_min_repeats_or_min_chars_it_does_not_fire() -> None:
    unit = "I should look at the sign once more, carefully this time. "  # 58 characters
    assert loop_at_end(PROSE + unit * 3, RULE) is None  # 3 < 4 repeats
    assert loop_at_end(PROSE + unit * 4, RULE) is not None
    short = "Hmm. "  # 5 characters: 30 repeats cover 150 < 160
    assert loop_at_end(PROSE + short * 30, RULE) is None
    assert loop_at_end(PROSE + short * 40, RULE) is not None


def test_a_unit_longer_than_max_unit_chars_is_not_a_loop() -> None:
    unit = PROSE[:600]
    assert loop_at_end(unit * 3, LoopRule(window_chars=4096, min_repeats=2)) is None
    assert loop_at_end(PROSE[:500] * 3, LoopRule(window_chars=4096, min_repeats=2)) is not None


def test_chinese_and_a_one_character_unit_are_loops() -> None:
    chinese = "让我再检查一下。"
    found = loop_at_end(PROSE + chinese * 30, RULE)
    assert found is not None and found[0] == len(chinese)
    bangs = loop_at_end("The answer is B" + "!" * 200, RULE)
    assert bangs is not None and bangs == (1, 200)
    assert loop_at_end("The answer is B" + "!" * 100, RULE) is None  # under min_chars


def test_only_the_window_is_read() -> None:
    looped = "Wait, let me check again. " * 40
    assert loop_at_end(looped, RULE) is not None
    # The same loop, long past: the last 2048 characters are prose and counting.
    later = ", ".join(str(i) for i in range(1, 700))
    assert len(later) > RULE.window_chars
    assert loop_at_end(looped + later, RULE) is None
    # A tail shorter than min_chars is never a loop.
    assert loop_at_end("!" * 200, LoopRule(window_chars=100)) is None


def test_the_watch_looks_every_every_chars_and_stays_fired() -> None:
    rule = LoopRule(every_chars=256)
    watch = LoopWatch(rule)
    unit = "again "  # the loop is there from 160 characters, seen at the 256th
    fed = 0
    fired_at = None
    for _ in range(100):
        fed += len(unit)
        if watch.feed(unit):
            fired_at = fed
            break
    assert fired_at is not None and 256 <= fired_at < 256 + len(unit)
    assert watch.looped == (len(unit), fired_at)
    assert watch.feed("something else entirely, not a loop at all") is True


def test_the_watch_does_not_fire_on_prose() -> None:
    watch = LoopWatch(RULE)
    assert not any(watch.feed(PROSE[i : i + 7]) for i in range(0, len(PROSE), 7))
    assert not any(watch.feed(c) for c in TABLE)


def test_window_zero_never_fires() -> None:
    off = LoopRule(window_chars=0)
    assert not off.on
    assert loop_at_end("!" * 5000, off) is None
    watch = LoopWatch(off)
    assert not any(watch.feed("again ") for _ in range(1000))
