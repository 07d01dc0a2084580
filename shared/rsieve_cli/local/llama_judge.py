"""The local stack's judge server: llama.cpp's own HTTP server (OpenAI-compatible), run in
this process by xllamacpp's prebuilt CPU wheel, serving one GGUF under one model id.

    python -m rsieve_cli.local.llama_judge --model FILE --alias NAME --port PORT

Why this runtime (docs/models.md, "The local stack's judge"): it is llama.cpp's C++ server
itself (continuous batching over parallel slots, a prompt cache per slot), installed as a
wheel with nothing to compile, loading the 1.1 GB Q4_K_M file in about 4 s. rsieve talks to
it through its `openai` interface like any other OpenAI-compatible endpoint.

It listens on 127.0.0.1 only, and requires a bearer key when RSIEVE_LLAMA_API_KEY is set
(the stack sets one: nothing on the machine judges through it without the stack's key).
The key is read from the environment, never from the command line, where `ps` shows it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from rsieve_cli.local.ports import HOST
from rsieve_cli.local.processes import popen
from rsieve_cli.local.ready import wait_ready

__all__ = ["API_KEY_ENV", "main", "start_llama_judge", "wait_llama_judge"]

API_KEY_ENV = "RSIEVE_LLAMA_API_KEY"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the GGUF file")
    parser.add_argument("--alias", required=True, help="the model id /v1/models lists")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    # Verdicts in flight: llama.cpp batches their decoding; reading a prompt is most of the
    # cost on a CPU, and a slot keeps its last prompt cached, so the shared instructions of
    # the judge's template are read once per slot, not once per verdict.
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--ctx-per-slot", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    # The prompt cache kept in RAM beside the slots (llama.cpp's --cache-ram): bounded.
    parser.add_argument("--cache-ram-mib", type=int, default=256)
    # Read the judge template's shared part into every slot once the model is loaded, while
    # the rest of the stack starts, so the first verdicts pay only for their own data.
    parser.add_argument("--no-warm", dest="warm", action="store_false")
    # Where the slots' state after the warm-up is kept between starts (llama.cpp's slot
    # save / restore): a later start restores the shared part into every slot from disk
    # (milliseconds) instead of reading it again (seconds of both cores per slot). The file
    # is named by what decides its content (see _prefix_file); absent: no file, as before.
    parser.add_argument("--kv-dir", default="")
    args = parser.parse_args(argv)
    key = os.environ.get(API_KEY_ENV, "")
    if not key and not _loopback(args.host):
        # Reachable from other machines (a container's 0.0.0.0): never without a key.
        parser.error(f"--host {args.host} is not loopback: set {API_KEY_ENV} (the bearer key)")

    import xllamacpp as xlc

    params = xlc.CommonParams()
    params.model.path = args.model
    params.model_alias = {args.alias}
    params.hostnames = [args.host]
    params.port = args.port
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx_per_slot * args.parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.cache_ram_mib = args.cache_ram_mib
    params.use_jinja = True  # the GGUF's own chat template, rendered by llama.cpp
    params.warmup = False
    # Prometheus counters at /metrics (tokens read and generated, requests): how a test or
    # an operator sees that a run called the judge, or did not.
    params.endpoint_metrics = True
    if key:
        params.api_keys = [key]
    prefix_file = ""
    if args.kv_dir:
        os.makedirs(args.kv_dir, exist_ok=True)
        params.slot_save_path = os.path.join(args.kv_dir, "")  # llama.cpp appends the name
        prefix_file = _prefix_file(args.model, args.ctx_per_slot, xlc)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    started = time.monotonic()
    server = xlc.Server(params)
    print(
        f"llama_judge: {args.alias} from {args.model} on {server.listening_address} "
        f"({args.parallel} slots, loaded in {time.monotonic() - started:.1f} s)",
        flush=True,
    )
    if args.warm:
        threading.Thread(
            target=_warm,
            args=(
                server.listening_address,
                args.alias,
                key,
                args.parallel,
                prefix_file,
                args.kv_dir,
            ),
            daemon=True,
        ).start()
    stop.wait()
    del server
    return 0


def _loopback(host: str) -> bool:
    """Whether `host` is an address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _prefix_file(model: str, ctx_per_slot: int, xlc: object) -> str:
    """The slot-state file's name: a hash of what decides its bytes (the GGUF by path,
    size and modification time; the prompt the warm-up sends; the slot's context; the
    llama.cpp build), so a changed model, template or runtime never restores stale state."""
    import hashlib
    import json

    from rsieve.judge.verdicts import build_judge_prompt

    stat = os.stat(model)
    decided = json.dumps(
        [
            os.path.realpath(model),
            stat.st_size,
            stat.st_mtime_ns,
            build_judge_prompt("", [""], ""),
            ctx_per_slot,
            getattr(xlc, "__version__", ""),
        ]
    )
    return f"judge-prefix-{hashlib.sha256(decided.encode()).hexdigest()[:24]}.bin"


def _warm(
    address: str, alias: str, key: str, slots: int, prefix_file: str = "", kv_dir: str = ""
) -> None:
    """Every slot's prompt cache holding the judge template's shared part (the prompt of
    an empty item): restored from `prefix_file` where an earlier start saved it; else one
    slot reads it (a one-token request) and is saved, and the other slots restore it."""
    import json
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    from rsieve.judge.verdicts import build_judge_prompt

    started = time.monotonic()
    headers = {"Content-Type": "application/json"} | (
        {"Authorization": f"Bearer {key}"} if key else {}
    )

    def post(path: str, payload: dict[str, object]) -> bool:
        request = urllib.request.Request(f"{address}{path}", json.dumps(payload).encode(), headers)
        try:
            urllib.request.urlopen(request, timeout=300).read()
            return True
        except OSError as exc:  # a warm-up that fails costs time later, nothing else
            print(f"llama_judge: warm-up step {path} failed: {exc}", flush=True)
            return False

    def read(slot: int) -> bool:
        return post(
            "/v1/chat/completions",
            {
                "model": alias,
                "messages": [{"role": "user", "content": build_judge_prompt("", [""], "")}],
                "max_tokens": 1,
                "temperature": 0,
                "id_slot": slot,  # llama.cpp's own field: this slot, not the least used
            },
        )

    def restore(slot: int) -> bool:
        return post(f"/slots/{slot}?action=restore", {"filename": prefix_file})

    how = "read"
    saved = bool(prefix_file) and os.path.isfile(os.path.join(kv_dir, prefix_file))
    if saved and all(restore(i) for i in range(slots)):
        how = "restored from disk"
    elif prefix_file and read(0) and post("/slots/0?action=save", {"filename": prefix_file}):
        with ThreadPoolExecutor(slots) as pool:
            if not all(pool.map(restore, range(1, slots))):
                list(pool.map(read, range(1, slots)))
        how = "read once, saved"
    else:
        with ThreadPoolExecutor(slots) as pool:
            list(pool.map(read, range(slots)))
    print(
        f"llama_judge: the judge template's shared part is cached in every slot ({how}, "
        f"{time.monotonic() - started:.1f} s)",
        flush=True,
    )


def start_llama_judge(
    *,
    model: Path,
    alias: str,
    port: int,
    api_key: str,
    log: Path,
    parallel: int = 4,
    kv_dir: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start llama.cpp's server (rsieve_cli.local.llama_judge) for the judge GGUF on
    127.0.0.1:``port``, requiring ``api_key`` (passed in the environment, not argv);
    ``kv_dir``: where the slots' warmed-up state is kept between starts."""
    cmd = [
        sys.executable, "-m", "rsieve_cli.local.llama_judge",
        "--model", str(model),
        "--alias", alias,
        "--host", HOST,
        "--port", str(port),
        "--parallel", str(parallel),
    ]  # fmt: skip
    if kv_dir is not None:
        cmd += ["--kv-dir", str(kv_dir)]
    return popen(cmd, log=log, env={**os.environ, API_KEY_ENV: api_key})


def wait_llama_judge(
    port: int,
    api_key: str,
    alias: str,
    timeout: float = 60.0,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    """Return when the judge server lists ``alias`` at /v1/models (the model is loaded)."""
    import httpx

    def listed() -> str | None:
        r = httpx.get(
            f"http://{HOST}:{port}/v1/models",
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=2.0,
        )
        if r.status_code == 200 and alias in {m.get("id") for m in r.json().get("data", [])}:
            return None
        return f"HTTP {r.status_code}"

    wait_ready(
        listed,
        timeout_s=timeout,
        what=f"the judge server on {HOST}:{port}",
        errors=(httpx.HTTPError, ValueError),
        proc=proc,
        proc_name="the llama.cpp judge server",
        log=log,
    )


if __name__ == "__main__":
    sys.exit(main())
