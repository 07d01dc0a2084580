"""Judges measured two ways: the canary set (do injections flip a verdict?) and the labelled
judge set (does the judge agree with a human label on answers the verifier rejected?).

    # canaries through the CPU stack's SmolLM2 judge on Triton (as before):
    .venv/bin/python -m bench.bench_judge [--configs rsieve,naive_both] [--out FILE]

    # the labelled set (bench/judge_set.jsonl) against judges on OpenAI-compatible endpoints:
    .venv/bin/python -m bench.bench_judge --endpoint http://127.0.0.1:18080/v1 \
        --model NAME [--model NAME2] [--judge URL NAME ...] [--run set,canaries] \
        [--max-tokens 64] [--inflight 4] [--limit N] [--tokenizer DIR]

Canary mode, Triton: starts tritonserver with `judge-smollm2` only (the checkpoint is
prepared first), sends every canary (10 wrong answers x 28 injections, tests/unit/cases)
through `rsieve.adapters.model.TritonModel` with the judge's tokenizer (special tokens
neutralised, as the judge service does), parses each reply with the judge's strict parser,
and prints a table (written to --out, bench/judge_results.json).

Endpoint mode: each judge is a model name on a base URL, called through rsieve's own
OpenAI-compatible adapter (`rsieve.adapters.openai_compat.OpenAIModel`, as the judge service
with `judge_interface=openai` does): one user message holding
`rsieve.judge.verdicts.build_judge_prompt(question, references, candidate)`, temperature 0,
`max_tokens` = --max-tokens, --inflight requests in flight, special tokens neutralised with
--tokenizer when given. Each reply is read with `rsieve.judge.verdicts.read_verdict` (a failed call
is FAILED `call_failed`). `--run set` (default) runs the labelled set, `--run canaries`
the 280 canary prompts (configs from --configs), both with `set,canaries`.

Per judge on the set: agreement (verdict == label, over every case), false promotions
(CORRECT on a WRONG label: count and % of WRONG cases), FAILED %, UNSURE count, recall on
right-but-rejected (CORRECT on a CORRECT label, % of CORRECT cases), verdicts per second
(cases / wall time, all requests in flight together) and the same per kind.

The guard hook: when `rsieve.judge` has a `guard` (or --guard MODULE:FUNC names one), the
set is first put through the guard alone (where it fires with no judge: WRONG cases it
stops, CORRECT cases it would block; no model call), then every judge's verdicts are put
through it and measured again as `<judge> +guard` (a CORRECT the guard blocks is not
promoted: counted as WRONG). `--run guard` does the first part only, with no endpoint.

Results are merged into bench/results.json (--results) under `judge_set` and
`judge_canaries` (--key): other keys are kept, and within a key the other judges too
(unless the set changed). Per-case verdicts go to bench/judge_set_verdicts.json.
Nothing here is asserted; figures go to docs/judge.md.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rsieve.generate.generation import ModelReply, ModelRequest
from rsieve.judge import verdicts as judge_module
from rsieve.judge.canaries import canary_flips
from rsieve.judge.verdicts import (
    TEMPLATE_SHA256,
    VERDICTS,
    ParsedVerdict,
    build_judge_prompt,
    parse_verdict,
    read_verdict,
)
from tests.unit.test_judge_canaries import CONFIGS, load_canaries

ROOT = Path(__file__).resolve().parents[1]

MODEL = "judge-smollm2"
SET = ROOT / "bench" / "judge_set.jsonl"
RESULTS = ROOT / "bench" / "results.json"
VERDICTS_OUT = ROOT / "bench" / "judge_set_verdicts.json"
SET_FIELDS = ("id", "family", "protocol", "question", "references", "candidate", "label", "kind")


# --- the labelled set ------------------------------------------------------------------


def load_set(path: Path = SET) -> list[dict[str, Any]]:
    cases = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    for case in cases:
        missing = [f for f in SET_FIELDS if f not in case]
        if missing:
            raise ValueError(f"{path}: case {case.get('id')!r} lacks {missing}")
    return cases


def spread(cases: list[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    """`limit` cases spread evenly over the set (the set is ordered by source and kind, so
    a spread keeps the mix); all of them without a limit."""
    if not limit or limit >= len(cases):
        return cases
    return [cases[i * len(cases) // limit] for i in range(limit)]


def _pct(k: int, n: int) -> float | None:
    return round(100 * k / n, 1) if n else None


def score(
    cases: Sequence[dict[str, Any]], verdicts: Sequence[str], wall_s: float | None
) -> dict[str, Any]:
    """The figures of one judge on the set (verdicts in the order of cases)."""
    labels = Counter(c["label"] for c in cases)
    got = Counter(verdicts)
    agree = sum(1 for c, v in zip(cases, verdicts, strict=True) if v == c["label"])
    false_promotions = [
        c["id"]
        for c, v in zip(cases, verdicts, strict=True)
        if v == "CORRECT" and c["label"] == "WRONG"
    ]
    promoted_right = sum(
        1
        for c, v in zip(cases, verdicts, strict=True)
        if v == "CORRECT" and c["label"] == "CORRECT"
    )
    by_kind: dict[str, dict[str, Any]] = {}
    grouped: dict[str, list[str]] = defaultdict(list)
    kind_label: dict[str, str] = {}
    for c, v in zip(cases, verdicts, strict=True):
        grouped[c["kind"]].append(v if v == c["label"] else f"{v}!")
        kind_label[c["kind"]] = c["label"]
    for kind in sorted(grouped, key=lambda k: (kind_label[k], k)):
        vs = grouped[kind]
        counts = Counter(v.rstrip("!") for v in vs)
        by_kind[kind] = {
            "label": kind_label[kind],
            "n": len(vs),
            "agree": sum(1 for v in vs if not v.endswith("!")),
            **{name: counts.get(name, 0) for name in VERDICTS},
        }
    n = len(cases)
    return {
        "cases": n,
        "labels": dict(labels),
        "verdicts": {name: got.get(name, 0) for name in VERDICTS},
        "agreement": {"k": agree, "n": n, "pct": _pct(agree, n)},
        "false_promotions": {
            "k": len(false_promotions),
            "n": labels["WRONG"],
            "pct": _pct(len(false_promotions), labels["WRONG"]),
            "ids": false_promotions,
        },
        "recall_right_but_rejected": {
            "k": promoted_right,
            "n": labels["CORRECT"],
            "pct": _pct(promoted_right, labels["CORRECT"]),
        },
        "failed_pct": _pct(got.get("FAILED", 0), n),
        "unsure": got.get("UNSURE", 0),
        "promotion_precision": _pct(promoted_right, got.get("CORRECT", 0)),
        "wall_s": round(wall_s, 1) if wall_s is not None else None,
        "verdicts_per_s": round(n / wall_s, 3) if wall_s else None,
        "by_kind": by_kind,
    }


def print_table(name: str, t: dict[str, Any]) -> None:
    fp, rc, ag = t["false_promotions"], t["recall_right_but_rejected"], t["agreement"]
    print(f"\n== {name}: {t['cases']} cases ({t['labels']})")
    print(
        f"agreement {ag['k']}/{ag['n']} = {ag['pct']}%   false promotions {fp['k']}/{fp['n']} = "
        f"{fp['pct']}% of WRONG   recall {rc['k']}/{rc['n']} = {rc['pct']}% of CORRECT"
    )
    print(
        f"FAILED {t['failed_pct']}%   UNSURE {t['unsure']}   promotion precision "
        f"{t['promotion_precision']}%   verdicts/s {t['verdicts_per_s']} (wall {t['wall_s']} s)"
    )
    if t.get("failure_causes"):
        print(f"failure causes {t['failure_causes']}")
    print(f"{'label':7} {'kind':20} {'n':>3} {'agree':>5}  CORRECT WRONG UNSURE FAILED")
    for kind, row in t["by_kind"].items():
        print(
            f"{row['label']:7} {kind:20} {row['n']:>3} {row['agree']:>5}  {row['CORRECT']:>7} "
            f"{row['WRONG']:>5} {row['UNSURE']:>6} {row['FAILED']:>6}"
        )
    if fp["ids"]:
        print("false promotions:", ", ".join(fp["ids"]))


# --- the guard hook ----------------------------------------------------------------------

GuardFn = Callable[..., Any]


def find_guard(spec: str | None) -> GuardFn | None:
    """--guard MODULE:FUNC, else `rsieve.judge.verdicts.guard` when it exists, else None."""
    if spec == "none":
        return None
    if spec:
        module, _, name = spec.partition(":")
        return getattr(importlib.import_module(module), name or "guard")
    return getattr(judge_module, "guard", None)


def call_guard(
    guard: GuardFn, case: dict[str, Any], parsed: ParsedVerdict | None, raw: str | None
) -> Any:
    """The guard's answer for one case. It is called with the arguments it names among
    question, references, candidate, verdict (the word), parsed (ParsedVerdict), raw_output,
    protocol, family, options; one that names none of them gets (question, references,
    candidate). `rsieve.judge.verdicts.guard(question, references, candidate)` is of the
    first kind."""
    available = {
        "question": case["question"],
        "references": list(case["references"]),
        "candidate": case["candidate"],
        "verdict": parsed.verdict if parsed else None,
        "parsed": parsed,
        "raw_output": raw,
        "raw": raw,
        "protocol": case["protocol"],
        "family": case["family"],
        "options": case.get("options"),
    }
    params = inspect.signature(guard).parameters
    named = {k: v for k, v in available.items() if k in params}
    if named:
        return guard(**named)
    return guard(case["question"], list(case["references"]), case["candidate"])


def guarded_verdict(out: Any, verdict: str) -> tuple[str, bool]:
    """(verdict after the guard, whether the guard fired). The guard's answer is None (let
    the verdict stand), a verdict word or a ParsedVerdict (the verdict it sets), or any other
    string: the reason the candidate may not be promoted (`rsieve.judge.verdicts.guard`). A blocked
    CORRECT is counted as WRONG here: it is not promoted, whatever the judge said."""
    if out is None:
        return verdict, False
    word = out if isinstance(out, str) else getattr(out, "verdict", None)
    if word in VERDICTS:
        return str(word), True
    if isinstance(out, str):
        return ("WRONG" if verdict == "CORRECT" else verdict), True
    raise ValueError(f"guard returned {out!r}")


def apply_guard(
    guard: GuardFn, case: dict[str, Any], parsed: ParsedVerdict, raw: str | None
) -> str:
    """The verdict after the guard (guarded_verdict)."""
    return guarded_verdict(call_guard(guard, case, parsed, raw), parsed.verdict)[0]


def guard_alone(guard: GuardFn, cases: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Where the guard fires with no judge at all (as if the judge had said CORRECT to
    every case): on WRONG cases it stops a promotion, on CORRECT ones it blocks a right
    answer. Deterministic; costs no model call."""
    fired: dict[str, list[str]] = {"WRONG": [], "CORRECT": []}
    by_kind: dict[str, dict[str, Any]] = {}
    reasons: Counter[str] = Counter()
    for case in cases:
        out = call_guard(guard, case, ParsedVerdict("CORRECT", None), None)
        _, hit = guarded_verdict(out, "CORRECT")
        row = by_kind.setdefault(case["kind"], {"label": case["label"], "n": 0, "fired": 0})
        row["n"] += 1
        if hit:
            row["fired"] += 1
            fired[case["label"]].append(case["id"])
            reasons[str(out).split(":")[0]] += 1
    labels = Counter(c["label"] for c in cases)
    return {
        "guard": f"{guard.__module__}.{guard.__qualname__}",
        "fired_on_wrong": {"k": len(fired["WRONG"]), "n": labels["WRONG"]},
        "fired_on_correct": {
            "k": len(fired["CORRECT"]),
            "n": labels["CORRECT"],
            "ids": fired["CORRECT"],
        },
        "reasons": dict(reasons),
        "by_kind": {k: by_kind[k] for k in sorted(by_kind, key=lambda k: (by_kind[k]["label"], k))},
    }


def print_guard_alone(g: dict[str, Any]) -> None:
    w, c = g["fired_on_wrong"], g["fired_on_correct"]
    print(f"\n== guard alone ({g['guard']}, no judge)")
    print(
        f"fires on {w['k']}/{w['n']} WRONG cases (promotions it stops) and {c['k']}/{c['n']} "
        f"CORRECT cases (right answers it would block); reasons {g['reasons']}"
    )
    for kind, row in g["by_kind"].items():
        if row["fired"]:
            print(f"  {row['label']:7} {kind:20} {row['fired']}/{row['n']}")
    if c["ids"]:
        print("blocks right answers:", ", ".join(c["ids"]))


# --- endpoints ---------------------------------------------------------------------------


def endpoint_model(url: str, name: str, args: argparse.Namespace) -> Any:
    from pydantic import SecretStr

    from rsieve.adapters.openai_compat import OpenAIModel

    key = os.environ.get(args.api_key_env, "") if args.api_key_env else ""
    return OpenAIModel(
        url,
        name,
        api_key=SecretStr(key) if key else None,
        max_inflight=args.inflight,
        timeout_s=args.timeout_s,
        max_new_tokens=args.max_tokens,
        temperature=0.0,
        tokenizer=args.tokenizer or "",
    )


def ask(model: Any, prompts: list[str]) -> tuple[list[ModelReply | Exception], float]:
    start = time.monotonic()
    replies = model.generate_many([ModelRequest(p) for p in prompts])
    return replies, time.monotonic() - start


def as_verdict(reply: ModelReply | Exception) -> tuple[ParsedVerdict, str | None, str | None]:
    """(verdict, raw output, finish reason) of one reply."""
    if isinstance(reply, ModelReply):
        return read_verdict(reply.text, reply.finish_reason), reply.text, reply.finish_reason
    return read_verdict(None, failure=f"{type(reply).__name__}: {reply}"), None, None


def run_set(
    judges: list[tuple[str, str]], args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, Any]]:
    all_cases = load_set(args.set)
    cases = spread(all_cases, args.limit)
    prompts = [
        build_judge_prompt(c["question"], list(c["references"]), c["candidate"]) for c in cases
    ]
    guard = find_guard(args.guard)
    alone = guard_alone(guard, cases) if guard is not None else None
    if alone is not None:
        print_guard_alone(alone)
    tables: dict[str, Any] = {}
    per_case: dict[str, Any] = {}
    for url, name in judges:
        label = f"{name} @ {url}"
        print(f"\n{label}: {len(cases)} cases, {args.inflight} in flight ...", flush=True)
        model = endpoint_model(url, name, args)
        replies, wall = ask(model, prompts)
        read = [as_verdict(r) for r in replies]
        verdicts = [p.verdict for p, _, _ in read]
        table = score(cases, verdicts, wall)
        table["failure_causes"] = dict(
            Counter((p.cause or "").split(":")[0] for p, _, _ in read if p.cause)
        )
        good = [r for r in replies if isinstance(r, ModelReply)]
        lat = [r.latency_s for r in good if r.latency_s is not None]
        table["latency_s"] = (
            {"median": round(statistics.median(lat), 2), "max": round(max(lat), 2)} if lat else None
        )
        table["completion_tokens"] = sum(r.output_tokens or 0 for r in good)
        table["served_as"] = model.info.version if model.info else None
        tables[label] = table
        print_table(label, table)
        rows = []
        guarded: list[str] = []
        blocked = 0
        for case, (parsed, raw, finish) in zip(cases, read, strict=True):
            row: dict[str, Any] = {
                "id": case["id"],
                "label": case["label"],
                "verdict": parsed.verdict,
                "cause": parsed.cause,
                "finish_reason": finish,
                "raw_output": raw[:400] if raw else raw,
            }
            if guard is not None:
                out = call_guard(guard, case, parsed, raw)
                after, _ = guarded_verdict(out, parsed.verdict)
                blocked += parsed.verdict == "CORRECT" and after != "CORRECT"
                row["guard"] = None if out is None else str(out)
                row["guarded"] = after
                guarded.append(after)
            rows.append(row)
        per_case[label] = rows
        if guard is not None:
            glabel = f"{label} +guard"
            gtable = score(cases, guarded, wall)
            gtable["guard"] = f"{guard.__module__}.{guard.__qualname__}"
            gtable["guard_blocked_promotions"] = blocked
            tables[glabel] = gtable
            print_table(glabel, gtable)
            print(f"the guard blocked {blocked} of the judge's CORRECT verdicts")
    set_bytes = args.set.read_bytes()
    meta = {
        "set": str(args.set.relative_to(ROOT) if args.set.is_relative_to(ROOT) else args.set),
        "set_sha256": hashlib.sha256(set_bytes).hexdigest(),
        "set_cases": len(all_cases),
        "cases_run": len(cases),
        "limit": args.limit,
        "template_sha256": TEMPLATE_SHA256,
        "max_tokens": args.max_tokens,
        "inflight": args.inflight,
        "tokenizer": args.tokenizer or None,
        "guard": f"{guard.__module__}.{guard.__qualname__}" if guard else None,
    }
    return {"meta": meta, "guard_alone": alone, "judges": tables}, per_case


def canary_table(
    cases: list[Any], replies: list[ModelReply | Exception], parse: Callable[..., str], wall: float
) -> dict[str, Any]:
    errors = [r for r in replies if not isinstance(r, ModelReply)]
    good = [r for r in replies if isinstance(r, ModelReply)]
    parsed = [parse_verdict(r.text, r.finish_reason) for r in good]
    verdicts = [parse(r.text, r.finish_reason) for r in good]
    flips = canary_flips(cases, verdicts) if not errors else []
    return {
        "wall_s": round(wall, 1),
        "verdicts_per_s": round(len(replies) / wall, 3) if wall else None,
        "errors": len(errors),
        "verdicts": dict(Counter(p.verdict for p in parsed)),
        "causes": dict(Counter((p.cause or "").split(":")[0] for p in parsed if p.cause)),
        "flips": len(flips),
        "flipped_to_correct": sum(1 for f in flips if f["verdict"] == "CORRECT"),
        "flipped": [
            {"case": f["case"], "injection": f["injection"], "verdict": f["verdict"]} for f in flips
        ],
        "examples": [r.text[:160] for r in good[:3]],
    }


def first_canaries(cases: list[Any], k: int | None) -> list[Any]:
    """The canaries of the first `k` wrong answers (each bare and with every injection, so
    flips are still counted against their bare case); all without `k`."""
    if not k:
        return cases
    keep = list(dict.fromkeys(c.case for c in cases))[:k]
    return [c for c in cases if c.case in keep]


def run_canaries_endpoint(
    judges: list[tuple[str, str]], args: argparse.Namespace
) -> dict[str, Any]:
    cases = first_canaries(load_canaries(), args.canary_cases)
    out: dict[str, Any] = {}
    if args.canaries_unguarded:
        # A flip needs the judge's CORRECT and the guard's pass: a canary the guard refuses
        # cannot flip whatever the judge says, so only the others need a model.
        from rsieve.judge.verdicts import guard

        refused = Counter(
            (guard(c.question, c.references, c.candidate) or "").split(":")[0] for c in cases
        )
        cases = [c for c in cases if guard(c.question, c.references, c.candidate) is None]
        out["guarded"] = {k: v for k, v in refused.items() if k}
        print(f"canaries the guard refuses (cannot flip): {out['guarded']}; asked: {len(cases)}")
    for url, name in judges:
        label = f"{name} @ {url}"
        model = endpoint_model(url, name, args)
        per_config: dict[str, Any] = {"cases": len(cases)}
        for config in args.configs.split(","):
            build, parse = CONFIGS[config]
            prompts = [build(c.question, c.references, c.candidate) for c in cases]
            print(f"\n{label}: canaries, {config}, {len(prompts)} prompts ...", flush=True)
            replies, wall = ask(model, prompts)
            per_config[config] = canary_table(cases, replies, parse, wall)
            print(config, json.dumps(per_config[config], ensure_ascii=False), flush=True)
        out[label] = per_config
    return out


# --- results.json ------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    try:
        from bench.bench_pipeline import machine_reference

        return machine_reference()
    except Exception:  # noqa: BLE001 - the pipeline bench's imports (the local stack) may be unavailable
        return {"cores": os.cpu_count(), "cpu_model": platform.processor() or "unknown"}


def merge_results(path: Path, key: str, section: dict[str, Any], same: str | None) -> None:
    """Put `section` under `key` in the JSON object at `path`, keeping every other key, and
    within the key every other judge unless `same` (a fingerprint of what was measured, such
    as the set's sha256) differs from the stored one."""
    try:
        whole = json.loads(path.read_text())
        if not isinstance(whole, dict):
            whole = {}
    except (OSError, ValueError):
        whole = {}
    stored = whole.get(key)
    old: dict[str, Any] = stored if isinstance(stored, dict) else {}
    kept = dict(old) if old.get("fingerprint") == same else {}
    judges = dict(kept.get("judges", {}))
    judges.update(section.pop("judges"))
    whole[key] = {**kept, **section, "fingerprint": same, "judges": judges}
    path.write_text(json.dumps(whole, indent=1, ensure_ascii=False, default=str) + "\n")


def merge_verdicts(path: Path, per_case: dict[str, Any]) -> None:
    """Per-case verdicts by judge, keeping the other judges already in the file."""
    try:
        whole = json.loads(path.read_text())
        if not isinstance(whole, dict):
            whole = {}
    except (OSError, ValueError):
        whole = {}
    whole.update(per_case)
    path.write_text(json.dumps(whole, indent=1, ensure_ascii=False) + "\n")


def guard_only(args: argparse.Namespace) -> None:
    """`--run guard`: where the guard fires on the set, with no judge and no endpoint."""
    guard = find_guard(args.guard)
    if guard is None:
        sys.exit("no guard: rsieve.judge has none and --guard names none")
    cases = spread(load_set(args.set), args.limit)
    alone = guard_alone(guard, cases)
    print_guard_alone(alone)
    sha = hashlib.sha256(args.set.read_bytes()).hexdigest()
    merge_results(
        args.results, args.key, {"guard_alone": alone, "judges": {}}, f"{sha}:{args.limit}"
    )
    print(f"\nwritten: {args.results} [{args.key}]")


# --- canaries through Triton (the original mode) ---------------------------------------------


@contextmanager
def _serve(root: Path, checkpoint: Path) -> Iterator[str]:
    """judge-smollm2 served from a copy of its folder; its gRPC address."""
    from rsieve_cli.local.triton_server import triton_on_free_ports

    repo = root / "models"
    shutil.copytree(ROOT / "deploy" / "triton" / "cpu" / MODEL, repo / MODEL)
    env = {"RSIEVE_JUDGE_CHECKPOINT": str(checkpoint)}
    log = root / "triton.log"
    with triton_on_free_ports(repo, log=log, ready=[MODEL], env_extra=env, timeout_s=300) as t:
        print(f"judge-smollm2 ready in {t.ready_s:.1f} s")
        yield t.grpc_url


def triton_canaries(args: argparse.Namespace) -> None:
    from rsieve.adapters.model import TritonModel
    from rsieve_cli.local.checkpoints import smollm2_checkpoint

    t0 = time.monotonic()
    checkpoint = smollm2_checkpoint()
    print(f"checkpoint {checkpoint} in {time.monotonic() - t0:.1f} s")
    cases = load_canaries()
    results: dict[str, Any] = {"cases": len(cases), "budget": args.max_tokens}
    with tempfile.TemporaryDirectory() as tmp:
        with _serve(Path(tmp), checkpoint) as url:
            model = TritonModel(
                url,
                MODEL,
                max_inflight=16,
                tokenizer=str(checkpoint),
                timeout_s=600,
                max_new_tokens=args.max_tokens,
            )
            # One at a time, then batched, on the same 16 prompts.
            probe = [ModelRequest(c.prompt()) for c in cases[:16]]
            single = TritonModel(
                url,
                MODEL,
                max_inflight=1,
                request_items=1,
                tokenizer=str(checkpoint),
                timeout_s=600,
                max_new_tokens=args.max_tokens,
            )
            start = time.monotonic()
            single.generate_many(probe)
            one_s = (time.monotonic() - start) / len(probe)
            start = time.monotonic()
            model.generate_many(probe)
            batched_s = (time.monotonic() - start) / len(probe)
            results["s_per_verdict"] = {
                "one_at_a_time": round(one_s, 3),
                "batched_16": round(batched_s, 3),
            }
            print("s per verdict:", results["s_per_verdict"], flush=True)
            for config in args.configs.split(","):
                build, parse = CONFIGS[config]
                prompts = [build(c.question, c.references, c.candidate) for c in cases]
                replies, wall = ask(model, prompts)
                results[config] = canary_table(cases, replies, parse, wall)
                print(config, json.dumps(results[config], ensure_ascii=False), flush=True)
    print(json.dumps(results, indent=1, ensure_ascii=False))
    args.out.write_text(json.dumps(results, indent=1, ensure_ascii=False))


# --- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="rsieve,naive_both", help="canary configs")
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "bench" / "judge_results.json",
        help="Triton canary mode's output",
    )
    parser.add_argument(
        "--max-tokens",
        "--budget",
        dest="max_tokens",
        type=int,
        default=64,
        help="judge_max_new_tokens (max_tokens on an endpoint)",
    )
    parser.add_argument("--endpoint", help="base URL of an OpenAI-compatible server (…/v1)")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        help="a model name on --endpoint (repeat for several judges)",
    )
    parser.add_argument(
        "--judge",
        nargs=2,
        action="append",
        default=[],
        metavar=("URL", "MODEL"),
        help="a judge on its own endpoint (repeatable)",
    )
    parser.add_argument("--run", default="set", help="set, canaries or set,canaries (endpoints)")
    parser.add_argument("--set", type=Path, default=SET)
    parser.add_argument(
        "--canary-cases",
        type=int,
        default=None,
        help="endpoint canaries: only the first K of the 10 wrong answers (K x 28 prompts)",
    )
    parser.add_argument(
        "--canaries-unguarded",
        action="store_true",
        help="endpoint canaries: only those the guard does not refuse (only they can flip)",
    )
    parser.add_argument("--limit", type=int, default=None, help="run N cases spread over the set")
    parser.add_argument("--inflight", type=int, default=4, help="requests in flight per judge")
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument(
        "--api-key-env",
        default="",
        help="environment variable holding the endpoint's key (never argv)",
    )
    parser.add_argument(
        "--tokenizer",
        default="",
        help="tokenizer folder: neutralise special tokens as the judge service does",
    )
    parser.add_argument(
        "--guard",
        default=None,
        help="MODULE:FUNC applied to every verdict; default rsieve.judge.verdicts.guard if "
        "it exists; 'none' to skip",
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--key", default="judge_set", help="results.json key of the set's figures")
    parser.add_argument("--verdicts-out", type=Path, default=VERDICTS_OUT)
    args = parser.parse_args(argv)

    judges = [(args.endpoint, m) for m in args.model] + [(u, m) for u, m in args.judge]
    if args.model and not args.endpoint:
        parser.error("--model needs --endpoint")
    runs = {r.strip() for r in args.run.split(",") if r.strip()}
    if not runs <= {"set", "canaries", "guard"}:
        parser.error(f"--run: unknown {sorted(runs - {'set', 'canaries', 'guard'})}")
    if runs == {"guard"}:
        guard_only(args)
        return
    if not judges:
        triton_canaries(args)
        return
    conditions = {"machine": machine(), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if "set" in runs:
        section, per_case = run_set(judges, args)
        fingerprint = f"{section['meta']['set_sha256']}:{section['meta']['limit']}"
        merge_results(args.results, args.key, {**section, "conditions": conditions}, fingerprint)
        merge_verdicts(args.verdicts_out, per_case)
        print(f"\nwritten: {args.results} [{args.key}], {args.verdicts_out}")
    if "canaries" in runs:
        tables = run_canaries_endpoint(judges, args)
        key = "judge_canaries"
        meta = {
            "configs": args.configs,
            "canary_cases": args.canary_cases,
            "unguarded_only": args.canaries_unguarded,
            "max_tokens": args.max_tokens,
            "inflight": args.inflight,
            "template_sha256": TEMPLATE_SHA256,
            "tokenizer": args.tokenizer or None,
        }
        merge_results(
            args.results,
            key,
            {"meta": meta, "conditions": conditions, "judges": tables},
            f"{TEMPLATE_SHA256}:{args.configs}:{args.canary_cases}",
        )
        print(f"\nwritten: {args.results} [{key}]")


if __name__ == "__main__":
    main()
