"""The real services as the local stack starts them: Triton (CPU models), Redis, SeaweedFS.

A module-scoped tritonserver serves ``deploy/triton/cpu/{rapidocr,judge-abstain}`` (plus a
copy of rapidocr with detection on) and the test-only ``tests/triton_models/replay``; the
tests talk to it over tritonclient gRPC exactly as the services do. The Redis and S3 tests
start their own processes with the same launchers (``rsieve_cli.local.processes``).
"""

from __future__ import annotations

import functools
import io
import json
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from botocore.config import Config
from PIL import Image, ImageDraw, ImageFont
from tritonclient.utils import InferenceServerException

from rsieve_cli.local import processes, redis_server, seaweedfs
from rsieve_cli.local.ports import free_port
from rsieve_cli.local.replay import replay_key
from rsieve_cli.local.triton_server import triton_on_free_ports

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CPU_REPO = ROOT / "deploy" / "triton" / "cpu"
REPLAY_MODEL = ROOT / "tests" / "triton_models" / "replay"
FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
ABSTAIN = "<think>No language model is served on this CPU stack; the judge abstains.</think>UNSURE"
MODELS = ["rapidocr", "rapidocr-det", "judge-abstain", "replay"]
KINDS = {
    "rapidocr": "ocr-engine",
    "rapidocr-det": "ocr-engine",
    "judge-abstain": "stand-in",
    "replay": "stand-in",
}


# --------------------------------------------------------------------------- helpers


def render_word(word: str, size: int = 48, canvas: tuple[int, int] | None = None) -> bytes:
    """PNG bytes of ``word`` in black DejaVuSans on white, tightly padded (a word crop)."""
    font = ImageFont.truetype(str(FONT), size)
    left, top, right, bottom = font.getbbox(word)
    pad = size // 3
    width, height = canvas or (right - left + 2 * pad, bottom - top + 2 * pad)
    img = Image.new("RGB", (int(width), int(height)), "white")
    draw = ImageDraw.Draw(img)
    x = (width - (right - left)) // 2 - left
    y = (height - (bottom - top)) // 2 - top
    draw.text((x, y), word, font=font, fill="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def alnum(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z]", "", text).upper()


def split_think(text: str) -> tuple[str, str]:
    assert text.startswith("<think>"), text
    think, sep, answer = text[len("<think>") :].partition("</think>")
    assert sep, text
    return think, answer


def make_inputs(prompt: str, image: bytes | None) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput("prompt", [1, 1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([[prompt.encode("utf-8")]], dtype=np.object_))
    if image is not None:
        inputs.append(grpcclient.InferInput("image", [1, 1], "BYTES"))
        inputs[1].set_data_from_numpy(np.array([[image]], dtype=np.object_))
    return inputs


def infer(
    client: grpcclient.InferenceServerClient, model: str, prompt: str, image: bytes | None
) -> tuple[str, str]:
    result = client.infer(model, make_inputs(prompt, image), client_timeout=60)
    text = result.as_numpy("text")
    finish = result.as_numpy("finish_reason")
    assert text.shape == (1, 1) and finish.shape == (1, 1)
    return text[0, 0].decode("utf-8"), finish[0, 0].decode("utf-8")


def infer_concurrently(
    client: grpcclient.InferenceServerClient,
    model: str,
    requests: Sequence[tuple[str, bytes | None]],
    timeout: float = 120.0,
) -> list[tuple[str, str] | Exception]:
    """Send all ``requests`` at once (async gRPC) and collect results in order."""
    results: list[tuple[str, str] | Exception | None] = [None] * len(requests)
    done = threading.Semaphore(0)

    def callback(
        index: int, result: grpcclient.InferResult | None, error: Exception | None
    ) -> None:
        if error is not None or result is None:
            results[index] = error or RuntimeError("no result")
        else:
            results[index] = (
                result.as_numpy("text")[0, 0].decode("utf-8"),
                result.as_numpy("finish_reason")[0, 0].decode("utf-8"),
            )
        done.release()

    for index, (prompt, image) in enumerate(requests):
        client.async_infer(
            model,
            make_inputs(prompt, image),
            callback=functools.partial(callback, index),
            client_timeout=timeout,
        )
    for _ in requests:
        assert done.acquire(timeout=timeout), "a concurrent request never completed"
    return [r for r in results if r is not None]


def model_counts(client: grpcclient.InferenceServerClient, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) of ``model`` from Triton's statistics."""
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


def settled_counts(
    client: grpcclient.InferenceServerClient, model: str, at_least: int = 0
) -> tuple[int, int]:
    """Counts once they stop moving (and reach ``at_least`` inferences).

    Triton records a Python-backend batch's statistics only after ``execute`` returns,
    which can be after the client has its responses.
    """
    deadline = time.monotonic() + 15
    last = model_counts(client, model)
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = model_counts(client, model)
        if now == last and now[0] >= at_least:
            return now
        last = now
    return last


# --------------------------------------------------------------------------- triton fixture


@dataclass
class TritonServer:
    grpc_url: str
    http_port: int
    replay_file: Path
    log: Path
    startup_s: float


REPLAY_PROMPT = "What does the sign say? Think, then answer."
REPLAY_IMAGE = b"\x89PNG fake bytes: the replay model never decodes them"
RECORDED = {
    replay_key(REPLAY_PROMPT, REPLAY_IMAGE): {
        "text": "<think>The sign reads ESPLANADE.</think>ESPLANADE",
        "finish_reason": "stop",
    },
    replay_key("text only prompt", None): {
        "text": "<think>A long chain of thought that ran out of tok",
        "finish_reason": "length",
    },
}


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    base = tmp_path_factory.mktemp("triton")
    repo = base / "models"
    repo.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(CPU_REPO / "rapidocr", repo / "rapidocr", ignore=ignore)
    shutil.copytree(CPU_REPO / "judge-abstain", repo / "judge-abstain", ignore=ignore)
    shutil.copytree(REPLAY_MODEL, repo / "replay", ignore=ignore)

    # rapidocr-det: the same model with text detection switched on by its config parameter.
    shutil.copytree(CPU_REPO / "rapidocr", repo / "rapidocr-det", ignore=ignore)
    det_config = repo / "rapidocr-det" / "config.pbtxt"
    text = det_config.read_text()
    assert 'name: "rapidocr"' in text and 'string_value: "false"' in text
    text = text.replace('name: "rapidocr"', 'name: "rapidocr-det"', 1)
    off = 'key: "use_det"\n  value: { string_value: "false" }'
    text = text.replace(off, off.replace('"false"', '"true"'))
    assert 'string_value: "true"' in text
    det_config.write_text(text)

    # replay: point the replay_file parameter at a temp file.
    replay_file = base / "replay.json"
    replay_file.write_text(json.dumps(RECORDED))
    replay_config = repo / "replay" / "config.pbtxt"
    text = replay_config.read_text()
    marker = 'key: "replay_file"\n  value: { string_value: "" }'
    assert marker in text
    replay_config.write_text(
        text.replace(marker, f'key: "replay_file"\n  value: {{ string_value: "{replay_file}" }}')
    )

    with triton_on_free_ports(
        repo, log=base / "triton.log", models=MODELS, stop_timeout_s=20
    ) as triton:
        yield TritonServer(
            triton.grpc_url, triton.http_port, replay_file, triton.log, triton.ready_s
        )


@pytest.fixture()
def client(triton: TritonServer) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(triton.grpc_url) as c:
        yield c


# --------------------------------------------------------------------------- triton tests


def test_server_serves_the_shared_interface(
    triton: TritonServer, client: grpcclient.InferenceServerClient
) -> None:
    assert triton.startup_s < 180
    for model in MODELS:
        meta = client.get_model_metadata(model, as_json=True)
        inputs = {t["name"]: (t["datatype"], t["shape"]) for t in meta["inputs"]}
        outputs = {t["name"]: (t["datatype"], t["shape"]) for t in meta["outputs"]}
        assert inputs == {"prompt": ("BYTES", ["-1", "1"]), "image": ("BYTES", ["-1", "1"])}
        assert outputs == {
            "text": ("BYTES", ["-1", "1"]),
            "finish_reason": ("BYTES", ["-1", "1"]),
        }
        config = client.get_model_config(model, as_json=True)["config"]
        assert config["max_batch_size"] == 16
        assert "dynamic_batching" in config
        assert config["instance_group"][0]["kind"] == "KIND_CPU"
        image_cfg = next(i for i in config["input"] if i["name"] == "image")
        assert image_cfg.get("optional") is True
        # What the model is, as the client reads it (deploy/triton/README.md).
        assert config["parameters"]["rsieve_kind"] == {"string_value": KINDS[model]}


def test_rapidocr_reads_a_rendered_word(client: grpcclient.InferenceServerClient) -> None:
    text, finish = infer(client, "rapidocr", "What does the image say?", render_word("ESPLANADE"))
    think, answer = split_think(text)
    assert alnum(answer) == "ESPLANADE", text
    assert "recognised" in think and "confidence" in think
    assert finish == "stop"


def test_rapidocr_ignores_the_prompt(client: grpcclient.InferenceServerClient) -> None:
    image = render_word("HARBOUR")
    first, _ = infer(client, "rapidocr", "", image)
    second, _ = infer(client, "rapidocr", "Ignore the image and say BANANA.", image)
    assert first == second
    assert alnum(split_think(first)[1]) == "HARBOUR"


def test_rapidocr_with_detection_reads_a_word_on_a_page(
    client: grpcclient.InferenceServerClient,
) -> None:
    image = render_word("ESPLANADE", canvas=(900, 600))
    text, finish = infer(client, "rapidocr-det", "read it", image)
    _think, answer = split_think(text)
    assert alnum(answer) == "ESPLANADE", text
    assert finish == "stop"


def test_rapidocr_blank_image_recognises_nothing(
    client: grpcclient.InferenceServerClient,
) -> None:
    buf = io.BytesIO()
    Image.new("RGB", (200, 64), "white").save(buf, format="JPEG")
    text, finish = infer(client, "rapidocr", "read it", buf.getvalue())
    think, answer = split_think(text)
    assert answer == "", text
    assert think.startswith("no text recognised")
    assert finish == "stop"


def test_rapidocr_transparent_png_is_read_on_white(
    client: grpcclient.InferenceServerClient,
) -> None:
    font = ImageFont.truetype(str(FONT), 48)
    img = Image.new("RGBA", (360, 80), (0, 0, 0, 0))
    ImageDraw.Draw(img).text((12, 8), "KESTREL", font=font, fill=(0, 0, 0, 255))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    text, _ = infer(client, "rapidocr", "", buf.getvalue())
    assert alnum(split_think(text)[1]) == "KESTREL", text


def test_rapidocr_request_errors(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="image input is required"):
        infer(client, "rapidocr", "no image", None)
    with pytest.raises(InferenceServerException, match="cannot decode image"):
        infer(client, "rapidocr", "junk", b"this is not an image")
    buf = io.BytesIO()
    Image.new("L", (8000, 6000), 255).save(buf, format="PNG")  # 48 MP > 40 MP
    with pytest.raises(InferenceServerException, match="exceeds the limit of 40000000 pixels"):
        infer(client, "rapidocr", "huge", buf.getvalue())
    # The model is still healthy afterwards.
    text, _ = infer(client, "rapidocr", "", render_word("ESPLANADE"))
    assert alnum(split_think(text)[1]) == "ESPLANADE"


def test_one_bad_request_does_not_fail_its_batch(
    client: grpcclient.InferenceServerClient,
) -> None:
    good = render_word("ESPLANADE")
    requests: Sequence[tuple[str, bytes | None]] = (
        [("", good)] * 7 + [("", b"broken")] + [("", good)] * 8
    )
    results = infer_concurrently(client, "rapidocr", requests)
    assert len(results) == 16
    for index, result in enumerate(results):
        if index == 7:
            assert isinstance(result, Exception) and "cannot decode image" in str(result)
        else:
            assert not isinstance(result, Exception), result
            assert alnum(split_think(result[0])[1]) == "ESPLANADE"


def test_sixteen_concurrent_requests_are_batched(
    client: grpcclient.InferenceServerClient,
) -> None:
    words = ["ESPLANADE", "HARBOUR", "KESTREL", "11850"] * 4
    before = settled_counts(client, "rapidocr")
    requests = [(f"q{i}", render_word(w)) for i, w in enumerate(words)]
    results = infer_concurrently(client, "rapidocr", requests)
    after = settled_counts(client, "rapidocr", at_least=before[0] + 16)
    for word, result in zip(words, results, strict=True):
        assert not isinstance(result, Exception), result
        text, finish = result
        assert alnum(split_think(text)[1]) == word, text
        assert finish == "stop"
    inferences, executions = after[0] - before[0], after[1] - before[1]
    assert inferences == 16
    assert executions < inferences, "the dynamic batcher never grouped requests"

    # The other models take a full concurrent batch too.
    judged = infer_concurrently(client, "judge-abstain", [(f"judge {i}", None) for i in range(16)])
    assert judged == [(ABSTAIN, "stop")] * 16


def test_judge_abstain_says_unsure(client: grpcclient.InferenceServerClient) -> None:
    assert infer(client, "judge-abstain", "Is 2+2=4 CORRECT?", None) == (ABSTAIN, "stop")
    text, finish = infer(client, "judge-abstain", "and with an image", render_word("ESPLANADE"))
    assert (text, finish) == (ABSTAIN, "stop")
    assert split_think(text)[1] == "UNSURE"


def test_replay_returns_recorded_outputs(client: grpcclient.InferenceServerClient) -> None:
    text, finish = infer(client, "replay", REPLAY_PROMPT, REPLAY_IMAGE)
    assert (text, finish) == ("<think>The sign reads ESPLANADE.</think>ESPLANADE", "stop")
    text, finish = infer(client, "replay", "text only prompt", None)
    assert (text, finish) == ("<think>A long chain of thought that ran out of tok", "length")


def test_replay_unknown_key_is_an_error(client: grpcclient.InferenceServerClient) -> None:
    key = replay_key(REPLAY_PROMPT, b"other image")
    with pytest.raises(InferenceServerException, match=f"no recorded output for key {key}"):
        infer(client, "replay", REPLAY_PROMPT, b"other image")
    # The same prompt without its image is a different key too.
    with pytest.raises(InferenceServerException, match="no recorded output"):
        infer(client, "replay", REPLAY_PROMPT, None)


def test_replay_picks_up_new_recordings(
    triton: TritonServer, client: grpcclient.InferenceServerClient
) -> None:
    records = json.loads(triton.replay_file.read_text())
    records[replay_key("added later", None)] = {
        "text": "<think>t</think>late",
        "finish_reason": "stop",
    }
    triton.replay_file.write_text(json.dumps(records))
    assert infer(client, "replay", "added later", None) == ("<think>t</think>late", "stop")


def test_replay_key_is_sha256_of_prompt_nul_image() -> None:
    import hashlib

    assert replay_key("p", b"img") == hashlib.sha256(b"p\0img").hexdigest()
    assert replay_key("p", None) == replay_key("p", b"") == hashlib.sha256(b"p\0").hexdigest()


# --------------------------------------------------------------------------- redis and s3


def _redis(port: int, *args: str) -> bytes:
    """One RESP command to Redis on 127.0.0.1:port; the raw reply."""
    payload = f"*{len(args)}\r\n".encode()
    for arg in args:
        data = arg.encode()
        payload += b"$%d\r\n%s\r\n" % (len(data), data)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(payload)
        return sock.recv(4096)


def _listening_ports(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found: set[tuple[str, int]] = set()
    for table, family in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 6)):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A = LISTEN
                continue
            address, port = fields[1].split(":")
            if family == 4:
                ip = socket.inet_ntop(socket.AF_INET, bytes.fromhex(address)[::-1])
            else:
                raw = bytes.fromhex(address)
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                ip = socket.inet_ntop(socket.AF_INET6, raw)
            found.add((ip, int(port, 16)))
    return found


WEED_DEFAULT_PORTS = {9333, 9340, 8888, 8333, 8080, 7333, 8181, 9101, 23646}
WEED_DEFAULT_PORTS |= {p + 10000 for p in WEED_DEFAULT_PORTS}


def test_redis_starts_on_its_port_and_keeps_its_aof(tmp_path: Path) -> None:
    port = free_port()
    state, log = tmp_path / "redis", tmp_path / "redis.log"
    proc = redis_server.start_redis(state_dir=state, port=port, log=log)
    try:
        redis_server.wait_redis(port, 20, proc=proc)
        assert _listening_ports(proc.pid) == {("127.0.0.1", port)}
        assert _redis(port, "SET", "rsieve:k", "v1") == b"+OK\r\n"
        assert _redis(port, "CONFIG", "GET", "appendonly").endswith(b"yes\r\n")
    finally:
        assert processes.stop(proc) == 0
    assert any(state.rglob("*.aof")), list(state.iterdir())

    proc = redis_server.start_redis(state_dir=state, port=port, log=log)
    try:
        redis_server.wait_redis(port, 20, proc=proc)
        assert _redis(port, "GET", "rsieve:k") == b"$2\r\nv1\r\n"
    finally:
        processes.stop(proc)
    assert proc.poll() is not None


def _s3(endpoint: str, access: str, secret: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
    )


def test_two_s3_stacks_side_by_side(tmp_path: Path) -> None:
    names = ("one", "two")
    s3_port = {name: free_port() for name in names}
    stacks: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str) -> None:
        t0 = time.monotonic()
        stacks[name] = seaweedfs.start_s3(
            state_dir=tmp_path / name,
            port=s3_port[name],
            bucket=f"bucket-{name}",
            access_key=f"key-{name}",
            secret_key=f"secret-{name}",
            log=tmp_path / f"{name}.log",
        )
        seaweedfs.wait_s3(
            f"http://127.0.0.1:{s3_port[name]}",
            f"key-{name}",
            f"secret-{name}",
            f"bucket-{name}",
            60,
            proc=stacks[name],
        )
        print(f"weed mini {name} ready in {time.monotonic() - t0:.1f}s")

    try:
        for name in names:
            start(name)
        for name in names:
            # Loopback only, none of weed's default ports, only the ports chosen for it.
            ports = seaweedfs.s3_ports(tmp_path / name)
            expected = {s3_port[name], *ports.values(), ports["admin"] + 10000}
            deadline = time.monotonic() + 30  # the admin server comes up after S3
            while True:
                listening = _listening_ports(stacks[name].pid)
                assert {ip for ip, _ in listening} == {"127.0.0.1"}, listening
                assert {port for _, port in listening} <= expected, (listening, expected)
                if {port for _, port in listening} == expected or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert {port for _, port in listening} == expected, (listening, expected, ports)
            assert not expected & WEED_DEFAULT_PORTS
        # Each stack works, with its own credentials and bucket.
        for name in names:
            s3 = _s3(f"http://127.0.0.1:{s3_port[name]}", f"key-{name}", f"secret-{name}")
            s3.put_object(Bucket=f"bucket-{name}", Key="k/obj.txt", Body=f"hello {name}".encode())
            body = s3.get_object(Bucket=f"bucket-{name}", Key="k/obj.txt")["Body"].read()
            assert body == f"hello {name}".encode()
            s3.close()
        # Restart stack one on the same state dir: same ports, the object survives.
        before = seaweedfs.s3_ports(tmp_path / "one")
        processes.stop(stacks["one"], 20)
        start("one")
        assert seaweedfs.s3_ports(tmp_path / "one") == before
        s3 = _s3(f"http://127.0.0.1:{s3_port['one']}", "key-one", "secret-one")
        assert s3.get_object(Bucket="bucket-one", Key="k/obj.txt")["Body"].read() == b"hello one"
        s3.close()
    finally:
        for proc in stacks.values():
            processes.stop(proc, 20)
