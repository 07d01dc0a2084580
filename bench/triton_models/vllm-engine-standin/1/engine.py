"""The scheduler of the vllm-engine-standin (benchmarks only): vLLM's continuous batching
simulated on wall-clock time, without any model, and the text its outputs carry (``Texts``).
Pure: no Triton, no threads, no I/O.

Why: a benchmark of the pipeline needs a generator that is saturated the way a vLLM engine
is, with sequences joining and leaving a running batch at step boundaries, so that what
the pipeline leaves idle shows up as missing running sequences, not as a fixed batch
window (bench/triton_models/fixed-latency-vlm models static batching instead).

The model (vLLM V1's scheduler, simplified):

- One decode step, in which every running sequence gains one token, takes
  ``a + b * running`` ms (``step_base_ms``, ``step_per_seq_ms``). A sequence admitted at a
  step boundary is prefilled in that step (chunked prefill folded into the step): its
  prefill tokens cost ``c`` ms each (``prefill_ms_per_token``), and it gains its first token
  in the same step, so an output of L tokens occupies L steps.
- A sequence's first admission prefills ``prefill_tokens`` (``submit``'s argument, the
  prompt by default); the caller passes fewer when the prompt's KV blocks are already
  there (a prefix-cache hit, or an n > 1 request's later outputs, which share the first
  one's prompt). The prompt tokens not prefilled are counted in ``prefix_cached_tokens``.
  The KV budget still charges every sequence its whole prompt: conservative, since vLLM
  holds shared blocks once.
- Waiting requests are admitted first come first served at a step boundary while
  ``running < max_num_seqs`` and the KV cache (``kv_budget_tokens``) holds the prompt plus
  that step's growth (one token per running sequence, the new one included). A blocked
  head blocks the queue, as in vLLM.
- A running sequence occupies prompt + generated tokens of KV cache. When the next step
  would overflow the budget, the most recently admitted sequence is preempted back to the
  front of the queue (vLLM's recompute policy): it keeps its generated tokens, and on
  readmission its prompt + generated tokens are prefilled again (a cache hit or not).
- ``abort`` removes a sequence, running or waiting, at once (a cancelled request): its KV
  is freed, the tokens it generated stay counted, and a running one leaves the step in
  progress, which is then timed without it (vLLM drops it at the next step; the
  difference is one step's b). ``progress`` tells how many tokens a live sequence has so
  far (what a streaming response has to show).
- Event-driven: a global token clock G counts steps; a sequence admitted at clock g0 with
  r tokens to go finishes at clock g0 + r (a heap of those); between events the running
  set is constant, so the steps that fit in a wall-clock interval are computed, not looped.
- Engine time follows wall-clock time: a GPU is not slowed down by a late host thread, so
  ``advance(now)`` credits every whole step that fits before ``now``.

Ceilings (N = max_num_seqs, every step full, times in seconds):

- peak decode rate: ``N / (a + b*N)`` tokens/s (no prefill);
- peak item rate for mean output length L and mean prompt P tokens:
  ``N / ((a + b*N) * L + N * c * P)`` items/s: N items finish every L steps of
  ``a + b*N``, and each of their N admissions adds ``c * P`` to a step (P: the tokens
  actually prefilled per sequence, fewer with prefix-cache hits and n > 1).

The text (``Texts``, ``prefix_chars``): each output's whole text is made when it is
queued, about 4 characters a token; its first k tokens are a proportional prefix of it.
Reasoning is drawn words that never repeat exactly; a loop repeats one unit exactly.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque

__all__ = ["LOOP_UNITS", "Engine", "Texts", "lognormal_tokens", "prefix_chars"]

Z99 = 2.3263  # the standard normal's 99th percentile


def lognormal_tokens(rng: random.Random, median: float, p99: float) -> int:
    """An output length (at least 1) from the lognormal with this median and 99th percentile:
    reasoning lengths have a long right tail, which is what makes continuous batching pay."""
    sigma = math.log(p99 / median) / Z99 if p99 > median else 0.0
    return max(1, round(rng.lognormvariate(math.log(median), sigma)))


class _Seq:
    __slots__ = ("admit_no", "g0", "generated", "prefill", "prompt", "rid", "total")

    def __init__(self, rid: object, prompt: int, total: int, prefill: int) -> None:
        self.rid, self.prompt, self.total, self.prefill = rid, prompt, total, prefill
        self.generated = 0  # tokens generated before the current admission
        self.g0 = 0  # the clock at the current admission
        # Tells a stale heap entry (a preempted admission) from a live one; 0: never admitted.
        self.admit_no = 0


class Engine:
    """vLLM-like continuous batching on a simulated clock; see the module docstring.

    Times are seconds on any monotonic clock; the parameters are as in config.pbtxt.
    Counters (monotonic, what a sampler differences): admitted (re-admissions after a
    preemption too), finished, aborted (sequences), steps, preemptions, generated_tokens
    (decode), prefill_tokens (tokens actually prefilled), prefix_cached_tokens (prompt
    tokens a first admission did not prefill), prefill_seconds, busy_seconds (time with a
    sequence running) and running_seconds (the integral of running over time: its change
    over a window divided by the window's length is the mean running, exactly). Gauges:
    ``len(running)``, ``len(waiting)``, ``kv_used``. Every admission ends in a finish, a
    preemption or an abort, or is running: admitted == finished + preemptions +
    (aborted while running) + len(running)."""

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
        self._live: dict[object, _Seq] = {}  # running or waiting, by request id
        self.kv_used = 0
        self._heap: list[tuple[int, int, object]] = []  # (finish clock, admit_no, rid)
        self._admits = 0
        self._done: list[tuple[object, int]] = []
        # Monotonic counters.
        self.admitted = self.finished = self.aborted = self.steps = self.preemptions = 0
        self.generated_tokens = self.prefill_tokens = self.prefix_cached_tokens = 0
        self.prefill_seconds = self.busy_seconds = self.running_seconds = 0.0

    # ------------------------------------------------------------------ public
    def submit(
        self,
        rid: object,
        prompt_tokens: int,
        output_tokens: int,
        now: float,
        prefill_tokens: int | None = None,
    ) -> int:
        """Queue a sequence (``rid`` unique among live ones); returns the output length it
        will get: at most what fits in the KV budget beside its prompt (vLLM cuts at
        max_model_len the same way). ``prefill_tokens`` (default: the prompt) is what its
        first admission prefills; the rest of the prompt counts as prefix-cached."""
        if prompt_tokens + 1 > self.kv_budget:
            raise ValueError(f"a prompt of {prompt_tokens} tokens cannot fit the KV budget")
        prefill = prompt_tokens if prefill_tokens is None else prefill_tokens
        if not 0 <= prefill <= prompt_tokens:
            raise ValueError(f"prefill_tokens {prefill} is not within the prompt's")
        if rid in self._live:
            raise ValueError(f"{rid!r} is queued or running already")
        self._run(now)
        total = max(1, min(output_tokens, self.kv_budget - prompt_tokens))
        seq = _Seq(rid, prompt_tokens, total, prefill)
        self.waiting.append(seq)
        self._live[rid] = seq
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

    def progress(self, rid: object) -> int:
        """Tokens a live (running or waiting) sequence has generated so far, whole steps
        credited by the last ``advance``/``submit``/``abort``; KeyError when not live."""
        seq = self._live[rid]
        if self.running.get(rid) is seq:
            return seq.generated + self.clock - seq.g0
        return seq.generated

    def abort(self, rid: object, now: float) -> int:
        """Remove a sequence, running or waiting, as of ``now`` (after crediting the steps
        before it): its KV is freed. Returns the tokens it will now never generate; 0 when
        it finished before ``now`` and was not yet reported by ``advance`` (it then never
        is). KeyError for an id neither live nor finished unreported."""
        self._run(now)
        seq = self._live.pop(rid, None)
        if seq is None:
            for i, (done_rid, _) in enumerate(self._done):
                if done_rid == rid:
                    del self._done[i]
                    return 0
            raise KeyError(rid)
        self.aborted += 1
        if self.running.get(rid) is seq:
            del self.running[rid]  # its heap entry goes stale: running no longer holds it
            generated = seq.generated + self.clock - seq.g0
            self.kv_used -= seq.prompt + generated
            if not self.running:
                # Nothing runs: the step in progress ends here, and its prefill with it.
                self.prefill_due = 0.0
                if self.waiting:  # freed room: admit now rather than never
                    self.t_boundary = now
                    self._boundary()
            return seq.total - generated
        self.waiting.remove(seq)
        return seq.total - seq.generated

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
                del self._live[rid]
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
            held = seq.prompt + seq.generated
            if seq.admit_no:  # a readmission after preemption: all of it again
                tokens = held
            else:
                tokens = seq.prefill
                self.prefix_cached_tokens += seq.prompt - seq.prefill
            self._admits += 1
            seq.g0, seq.admit_no = self.clock, self._admits
            self.running[seq.rid] = seq
            heapq.heappush(heap, (self.clock + seq.total - seq.generated, seq.admit_no, seq.rid))
            self.kv_used += held
            self.prefill_tokens += tokens
            self.prefill_seconds += self.c * tokens
            self.prefill_due += self.c * tokens
            self.admitted += 1


# ---------------------------------------------------------------------- the outputs' text
# Words of plausible reasoning about an image of text: the filler of normal outputs is drawn
# from them, so it never repeats the way a decoding loop does (exact repetition is what a
# loop detector looks for; one sentence repeated would look like one).
_WORDS = """
the a an this that these those it its is are was were be been being has have had do does
did not no yes so but or and if then than when while because since though although yet
still also only just even again once first second third fourth fifth last next previous
left right top bottom middle upper lower edge corner line row column word words letter
letters character characters glyph glyphs stroke strokes mark marks dot dots curve curves
loop bar bars hook tail serif serifs space gap spacing width height size shape shapes form
image picture photo scan crop region area part piece section block frame border background
foreground ink paper light dark faint bold thin thick blurred sharp clear noisy tilted
rotated skewed slanted upright small large tiny wide narrow long short round square
straight bent broken joined separate close far near above below beside between inside
outside around across along over under after before during about against within without
read reading reads look looking looks see seeing seems seem appear appears check checking
compare comparing match matches matching count counting guess guessing consider
considering assume suppose note notice notes expect expected confirm confirms confirmed
verify verifying decide deciding choose choosing fits fit differs differ resembles resemble
could would should might must may can will shall probably possibly likely unlikely
certainly clearly perhaps maybe rather quite fairly mostly partly nearly almost exactly
roughly slightly closer further already instead otherwise however therefore thus hence
question answer answers option options choice candidate candidates reading readings
meaning sense context sentence phrase label title caption number numbers digit digits
figure figures symbol symbols sign signs accent accents diacritic punctuation comma period
colon hyphen dash bracket quote apostrophe capital lowercase uppercase cursive printed
handwritten typed font fonts script alphabet latin greek cyrillic chinese kanji kana
hangul arabic hebrew devanagari thai vowel vowels consonant consonants syllable syllables
sound pronunciation spelling spelled order sequence pattern patterns detail details
feature features evidence reason reasons step steps case cases example instance part
whole half quarter most some many few several each every other another same different
similar distinct obvious subtle important relevant unclear ambiguous consistent plausible
correct incorrect wrong right true false possible impossible strange unusual typical
common rare known familiar original copy version earlier later start end beginning
ending point position place spot location direction angle height length distance
one two three four five six seven eight nine ten zero hundred
""".split()
# A few things a looping model says over and over, each 40 to 120 characters and ending in
# a space, so that one unit follows another as the loop's text does.
LOOP_UNITS = (
    "Wait, let me look at the third character again. ",
    "Hmm, the second stroke could also belong to the next letter, so let me check that. ",
    "Let me re-read the whole line from the start to be sure of every character. ",
    "Actually, I am not sure that this mark is a character at all; let me look again. ",
    "So the answer should be the word on the left, but wait, the right one fits too. ",
)
THINK_CLOSE = "</think>\n\n"


def prefix_chars(text: str, total_tokens: int, tokens: int) -> int:
    """How many characters of an output's ``text`` (``total_tokens`` long) its first
    ``tokens`` tokens are: proportional, so that a shorter prefix is a prefix of a longer
    one and all of the tokens are the whole text (a streamed output's deltas add up)."""
    if tokens >= total_tokens:
        return len(text)
    return len(text) * max(0, tokens) // total_tokens


class Texts:
    """The text of the outputs, about 4 characters a token; cheap (slices of one stream).

    The filler is a slice of a long pseudo-random stream of words (about 2**20 characters,
    made once, a word never directly after itself) at an offset each output draws from its
    own rng, so it is deterministic per output, differs between outputs and never ends in
    a unit repeated 4 times. A loop is ``stretch`` tokens of filler, then one unit of
    LOOP_UNITS repeated exactly to the end."""

    def __init__(self, chars: int = 1 << 20, seed: str = "rsieve-standin-words") -> None:
        rng = random.Random(seed)
        parts: list[str] = []
        size, last, capital = 0, "", True
        while size < chars:
            word = rng.choice(_WORDS)
            if word == last:  # "the the the the" would be a loop
                continue
            last = word
            text = word.capitalize() if capital else word
            draw = rng.random()
            capital = draw < 0.06
            text += "." if capital else "," if draw < 0.12 else ""
            parts.append(text)
            size += len(text) + 1
        self.stream = " ".join(parts) + " "

    def filler(self, rng: random.Random, chars: int) -> str:
        """``chars`` characters of words (fewer by a trailing space), from a word start at an
        offset drawn from ``rng``; wraps around the stream for very long outputs."""
        if chars <= 0:
            return ""
        stream = self.stream
        start = stream.find(" ", rng.randrange(len(stream))) + 1
        out = stream[start : start + chars]
        while len(out) < chars:
            out += stream[: chars - len(out)]
        return out.rstrip(" ")

    def compose(
        self,
        rng: random.Random,
        *,
        opening: str,
        plain: bool,
        answer: str,
        tokens: int,
        truncated: bool,
        loop: tuple[int, str] | None = None,
    ) -> str:
        """One output's whole text for ``tokens`` generated tokens. ``opening``: the
        ``<think>\\n`` the model writes itself ("" when the template opened it); ``plain``:
        reasoning off, the answer alone; ``truncated``: cut where the budget ended, inside
        the reasoning (no closing tag, no answer); ``loop``: (stretch tokens, unit), a
        repetition loop to the end (truncated whatever ``truncated`` says)."""
        if loop is not None:
            stretch, unit = loop
            budget = 4 * tokens
            body = self.filler(rng, min(4 * stretch, budget))
            body = body.rstrip(".,") + ". " if body else ""
            body += unit * (max(0, budget - len(body)) // len(unit) + 1)
            return opening + body[:budget]
        if plain:
            return answer[: 4 * tokens] if truncated else answer
        if truncated:
            return opening + self.filler(rng, 4 * tokens)
        reasoning = max(0, tokens - 2 - math.ceil(len(answer) / 4))
        return opening + self.filler(rng, 4 * reasoning) + THINK_CLOSE + answer
