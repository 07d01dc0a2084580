"""Repetition loops caught while the model still generates (docs/sampling.md, "Loops cut
short"). Pure.

A reasoning model that falls into a loop repeats one stretch of text, word for word, until
its token budget ends; the output is then cut off inside the reasoning and teaches
nothing, but every token of the loop was paid for. A streamed generation is watched
instead: `LoopWatch.feed` takes each delta and says, every `LoopRule.every_chars` new
characters, whether the text now ends in a loop; the caller cancels the request and
records the output as `repetition_loop` (rsieve.schemas.REJECT_REASONS), counting the
tokens it did not generate as saved.

What counts as a loop (`loop_at_end`): the text's last characters are one unit of at most
`max_unit_chars` repeated at least `min_repeats` times in a row, exactly, covering at
least `min_chars`. Exact repetition is what a decoding loop looks like (the same tokens
come back because they were the likeliest continuation of themselves); reasoning that
returns to a subject in other words is not cut. A unit is found by looking up the tail's
last 32 characters earlier in it (`str.rfind`, in C): a loop has them again exactly one
unit earlier, so normal prose costs a lookup or two, and each candidate unit is checked by
comparing the tail with the unit repeated.

The trace gate's `repetition` check (rsieve.compact.traces) judges whole accepted traces
by the share one span covers; this catches the running loop at its end, before the budget
is spent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rsieve.settings import Settings

__all__ = ["STREAMED_TOKEN_CPU_US", "LoopRule", "LoopWatch", "loop_at_end"]

# What watching costs the generator: CPU microseconds per streamed response, which is per
# generated token against Triton's vLLM backend (a response per engine step). Measured by
# bench/bench_streams.py on 2 cores (issue 53: 181 us per response through rsieve's client,
# 190 for a bare grpc.aio reader: the cost is gRPC's, docs/performance.md). The card
# multiplies a run's generated tokens by it.
STREAMED_TOKEN_CPU_US = 180.0


@dataclass(frozen=True)
class LoopRule:
    """When a streamed output is a loop. `window_chars`: the tail examined (0: no
    watching); `every_chars`: new characters between two looks."""

    window_chars: int = 2048
    min_repeats: int = 4
    min_chars: int = 160
    max_unit_chars: int = 512
    every_chars: int = 256

    @property
    def on(self) -> bool:
        return self.window_chars > 0

    @classmethod
    def of(cls, s: Settings) -> LoopRule:
        return cls(
            window_chars=s.loop_window_chars,
            min_repeats=s.loop_min_repeats,
            min_chars=s.loop_min_chars,
        )


# The tail's last characters looked up again to find a unit: any loop of `min_repeats`
# units covering `min_chars` has them again exactly one unit earlier.
_PROBE_CHARS = 32


def loop_at_end(text: str, rule: LoopRule) -> tuple[int, int] | None:
    """(unit characters, characters the repeats cover) when `text` ends in a loop, else
    None. Only the last `rule.window_chars` characters are read."""
    tail = text[-rule.window_chars :] if rule.window_chars else ""
    n = len(tail)
    if n < rule.min_chars:
        return None
    width = max(1, min(_PROBE_CHARS, rule.min_chars // rule.min_repeats))
    probe = tail[n - width :]
    at = n - width  # where the probe starts
    lowest = max(0, at - rule.max_unit_chars)
    hi = n - 1  # an earlier occurrence starts before `at`
    while (found := tail.rfind(probe, lowest, hi)) >= 0:
        unit = at - found
        hi = found + width - 1
        if unit * rule.min_repeats > n:
            break  # farther occurrences only give longer units
        piece = tail[n - unit :]
        if tail.endswith(piece * rule.min_repeats):
            repeats = rule.min_repeats
            while n >= (repeats + 1) * unit and tail.startswith(piece, n - (repeats + 1) * unit):
                repeats += 1
            covered = repeats * unit
            while covered < n and tail[n - covered - 1] == piece[-1 - (covered % unit)]:
                covered += 1  # a part of the unit before the whole ones
            if covered >= rule.min_chars:
                return unit, covered
    return None


@dataclass
class LoopWatch:
    """One streamed output's watch: `feed` each delta; True once the text ends in a loop
    (and from then on). `text` holds the last `window_chars` characters as of the latest
    look; the deltas since are kept apart until the next one, so a delta costs an append
    (against vLLM's backend a response carries one token: joining the 2 KB tail on each
    was most of what watching cost)."""

    rule: LoopRule
    text: str = ""
    looped: tuple[int, int] | None = None
    _since: int = field(default=0, repr=False)
    _pending: list[str] = field(default_factory=list, repr=False)

    def feed(self, delta: str) -> bool:
        if self.looped is not None:
            return True
        if not self.rule.on:
            return False
        self._pending.append(delta)
        self._since += len(delta)
        if self._since >= self.rule.every_chars:
            # Only the tail is ever read: keeping it bounds the watch's memory and copying.
            self.text = (self.text + "".join(self._pending))[-self.rule.window_chars :]
            self._pending.clear()
            self._since = 0
            self.looped = loop_at_end(self.text, self.rule)
        return self.looped is not None
