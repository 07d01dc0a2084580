"""The scheduler of the vllm-engine-standin (benchmarks only): vLLM's continuous batching
simulated on wall-clock time, without any model. Pure: no Triton, no threads, no I/O.

Why: a benchmark of the pipeline needs a generator that is saturated the way a vLLM engine
is, with sequences joining and leaving a running batch at step boundaries, so that what
the pipeline leaves idle shows up as missing running sequences, not as a fixed batch
window (bench/triton_models/fixed-latency-vlm models static batching instead).

The model (vLLM V1's scheduler, simplified):

- One decode step, in which every running sequence gains one token, takes
  ``a + b * running`` ms (``step_base_ms``, ``step_per_seq_ms``). A sequence admitted at a
  step boundary is prefilled in that step (chunked prefill folded into the step): its
  prompt tokens cost ``c`` ms each (``prefill_ms_per_token``), and it gains its first token
  in the same step, so an output of L tokens occupies L steps.
- Waiting requests are admitted first come first served at a step boundary while
  ``running < max_num_seqs`` and the KV cache (``kv_budget_tokens``) holds the prompt plus
  that step's growth (one token per running sequence, the new one included). A blocked
  head blocks the queue, as in vLLM.
- A running sequence occupies prompt + generated tokens of KV cache. When the next step
  would overflow the budget, the most recently admitted sequence is preempted back to the
  front of the queue (vLLM's recompute policy): it keeps its generated tokens, and on
  readmission its prompt + generated tokens are prefilled again.
- Event-driven: a global token clock G counts steps; a sequence admitted at clock g0 with
  r tokens to go finishes at clock g0 + r (a heap of those); between events the running
  set is constant, so the steps that fit in a wall-clock interval are computed, not looped.
- Engine time follows wall-clock time: a GPU is not slowed down by a late host thread, so
  ``advance(now)`` credits every whole step that fits before ``now``.

Ceilings (N = max_num_seqs, every step full, times in seconds):

- peak decode rate: ``N / (a + b*N)`` tokens/s (no prefill);
- peak item rate for mean output length L and mean prompt P tokens:
  ``N / ((a + b*N) * L + N * c * P)`` items/s: N items finish every L steps of
  ``a + b*N``, and each of their N admissions adds ``c * P`` to a step.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque

__all__ = ["Engine", "lognormal_tokens"]

Z99 = 2.3263  # the standard normal's 99th percentile


def lognormal_tokens(rng: random.Random, median: float, p99: float) -> int:
    """An output length (at least 1) from the lognormal with this median and 99th percentile:
    reasoning lengths have a long right tail, which is what makes continuous batching pay."""
    sigma = math.log(p99 / median) / Z99 if p99 > median else 0.0
    return max(1, round(rng.lognormvariate(math.log(median), sigma)))


class _Seq:
    __slots__ = ("admit_no", "g0", "generated", "prompt", "rid", "total")

    def __init__(self, rid: object, prompt: int, total: int) -> None:
        self.rid, self.prompt, self.total = rid, prompt, total
        self.generated = 0  # tokens generated before the current admission
        self.g0 = 0  # the clock at the current admission
        self.admit_no = 0  # tells a stale heap entry (a preempted admission) from a live one


class Engine:
    """vLLM-like continuous batching on a simulated clock; see the module docstring.

    Times are seconds on any monotonic clock; the parameters are as in config.pbtxt.
    Counters (monotonic, what a sampler differences): admitted (re-admissions after a
    preemption too), finished, steps, preemptions, generated_tokens (decode),
    prefill_tokens, prefill_seconds, busy_seconds (time with a sequence running) and
    running_seconds (the integral of running over time: its change over a window divided
    by the window's length is the mean running, exactly). Gauges: ``len(running)``,
    ``len(waiting)``, ``kv_used``."""

    def __init__(
        self,
        *,
        max_num_seqs: int = 256,
        step_base_ms: float = 4.0,
        step_per_seq_ms: float = 0.02,
        prefill_ms_per_token: float = 0.005,
        kv_budget_tokens: int = 524288,
    ) -> None:
        if max_num_seqs < 1 or kv_budget_tokens < 2 or step_base_ms + step_per_seq_ms <= 0:
            raise ValueError("max_num_seqs >= 1, kv_budget_tokens >= 2 and a positive step")
        self.max_num_seqs, self.kv_budget = max_num_seqs, kv_budget_tokens
        self.a, self.b = step_base_ms / 1e3, step_per_seq_ms / 1e3
        self.c = prefill_ms_per_token / 1e3
        self.clock = 0  # G: steps done
        self.t_boundary = 0.0  # when the current step began (running > 0)
        self.t_credited = 0.0  # the integrals below are credited up to here
        self.prefill_due = 0.0  # prefill seconds added to the current step
        self.running: dict[object, _Seq] = {}  # admission order: last = most recent
        self.waiting: deque[_Seq] = deque()
        self.kv_used = 0
        self._heap: list[tuple[int, int, object]] = []  # (finish clock, admit_no, rid)
        self._admits = 0
        self._done: list[tuple[object, int]] = []
        # Monotonic counters.
        self.admitted = self.finished = self.steps = self.preemptions = 0
        self.generated_tokens = self.prefill_tokens = 0
        self.prefill_seconds = self.busy_seconds = self.running_seconds = 0.0

    # ------------------------------------------------------------------ public
    def submit(self, rid: object, prompt_tokens: int, output_tokens: int, now: float) -> int:
        """Queue a request; returns the output length it will get: at most what fits in the
        KV budget beside its prompt (vLLM cuts at max_model_len the same way)."""
        if prompt_tokens + 1 > self.kv_budget:
            raise ValueError(f"a prompt of {prompt_tokens} tokens cannot fit the KV budget")
        self._run(now)
        total = max(1, min(output_tokens, self.kv_budget - prompt_tokens))
        self.waiting.append(_Seq(rid, prompt_tokens, total))
        # An idle engine starts a step at once, and requests that arrive at the very instant
        # a step starts join it (a batch handed over together is scheduled together).
        if not self.running or now == self.t_boundary:
            self.t_boundary = now
            self._boundary()
        return total

    def advance(self, now: float) -> list[tuple[object, int]]:
        """Run every whole step that fits before ``now``; the requests finished since the last
        call, as (request id, tokens generated)."""
        self._run(now)
        done, self._done = self._done, []
        return done

    def next_event_time(self, now: float) -> float | None:
        """When the next completion, preemption or admission happens if nothing arrives;
        None when idle. Only a completion needs a caller to wake up, the others are cheap."""
        if not self.running:
            return None
        k = self._steps_to_event()
        return self.t_boundary + self.prefill_due + k * self._step()

    def peak_decode_tokens_per_s(self) -> float:
        """Every step full: N tokens per a + b*N seconds."""
        return self.max_num_seqs / (self.a + self.b * self.max_num_seqs)

    def peak_items_per_s(self, mean_output_tokens: float, mean_prompt_tokens: float) -> float:
        """Every step full: N items finish every L steps, each admission adds c*P."""
        n = self.max_num_seqs
        return n / ((self.a + self.b * n) * mean_output_tokens + n * self.c * mean_prompt_tokens)

    # ------------------------------------------------------------------ internals
    def _step(self) -> float:
        return self.a + self.b * len(self.running)

    def _credit(self, t: float) -> None:
        """Integrate running over [t_credited, t] with the running count of that interval."""
        if t > self.t_credited:
            dt = t - self.t_credited
            n = len(self.running)
            self.running_seconds += n * dt
            if n:
                self.busy_seconds += dt
            self.t_credited = t

    def _steps_to_event(self) -> int:
        """Steps until the next boundary at which something changes (running > 0)."""
        heap = self._heap
        while heap:
            seq = self.running.get(heap[0][2])
            if seq is not None and seq.admit_no == heap[0][1]:
                break
            heapq.heappop(heap)  # a preempted admission's stale entry
        n = len(self.running)
        k = heap[0][0] - self.clock
        k = min(k, (self.kv_budget - self.kv_used) // n)  # then the next step would overflow
        if self._admissible():
            k = 1  # an arrival waits for the next boundary only
        return max(1, k)

    def _admissible(self) -> bool:
        if not self.waiting or len(self.running) >= self.max_num_seqs:
            return False
        head = self.waiting[0]
        need = head.prompt + head.generated + len(self.running) + 1
        return self.kv_used + need <= self.kv_budget

    def _run(self, now: float) -> None:
        while self.running:
            k = self._steps_to_event()
            step = self._step()
            if self.t_boundary + self.prefill_due + k * step <= now:
                self._apply(k, step)
                self._boundary()
                continue
            elapsed = now - self.t_boundary - self.prefill_due
            if elapsed >= step:  # whole steps that fit, short of the event
                self._apply(min(k - 1, int(elapsed // step)), step)
            break
        self._credit(now)

    def _apply(self, k: int, step: float) -> None:
        if k <= 0:
            return
        end = self.t_boundary + self.prefill_due + k * step
        self._credit(end)
        n = len(self.running)
        self.clock += k
        self.steps += k
        self.kv_used += n * k
        self.generated_tokens += n * k
        self.t_boundary, self.prefill_due = end, 0.0

    def _boundary(self) -> None:
        """At a step boundary: completions, then preemptions, then admissions."""
        heap = self._heap
        while heap and heap[0][0] <= self.clock:
            _, admit_no, rid = heapq.heappop(heap)
            seq = self.running.get(rid)
            if seq is not None and seq.admit_no == admit_no:
                del self.running[rid]
                self.kv_used -= seq.prompt + seq.total
                self.finished += 1
                self._done.append((rid, seq.total))
        while self.running and self.kv_used + len(self.running) > self.kv_budget:
            rid = next(reversed(self.running))
            seq = self.running.pop(rid)
            seq.generated += self.clock - seq.g0
            self.kv_used -= seq.prompt + seq.generated
            self.waiting.appendleft(seq)
            self.preemptions += 1
        while self._admissible():
            seq = self.waiting.popleft()
            tokens = seq.prompt + seq.generated
            self._admits += 1
            seq.g0, seq.admit_no = self.clock, self._admits
            self.running[seq.rid] = seq
            heapq.heappush(heap, (self.clock + seq.total - seq.generated, seq.admit_no, seq.rid))
            self.kv_used += tokens
            self.prefill_tokens += tokens
            self.prefill_seconds += self.c * tokens
            self.prefill_due += self.c * tokens
            self.admitted += 1
