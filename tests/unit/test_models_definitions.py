"""The model repository as data: the production vLLM definitions against what Triton's
vLLM backend expects (deploy/triton/README.md cites where each fact was read), the portable
HF model's interface, and the test mimic's faithfulness to the vLLM definition. Each
config.pbtxt is parsed with Triton's own ModelConfig protobuf, so an unknown field fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

ROOT = Path(__file__).resolve().parents[2]
VLLM = ROOT / "deploy" / "triton" / "vllm"
HF_VLM = ROOT / "deploy" / "triton" / "hf" / "vlm"
MIMIC = ROOT / "tests" / "triton_models" / "vllm-mimic"

# vllm_backend src/model.py auto_complete_config: name -> (type, dims, optional)
BACKEND_INPUTS = {
    "text_input": ("TYPE_STRING", [1], False),
    "image": ("TYPE_STRING", [-1], True),
    "stream": ("TYPE_BOOL", [1], True),
    "sampling_parameters": ("TYPE_STRING", [1], True),
    "exclude_input_in_output": ("TYPE_BOOL", [1], True),
    "return_finish_reason": ("TYPE_BOOL", [1], True),
    "return_cumulative_logprob": ("TYPE_BOOL", [1], True),
    "return_logprobs": ("TYPE_BOOL", [1], True),
    "return_num_input_tokens": ("TYPE_BOOL", [1], True),
    "return_num_output_tokens": ("TYPE_BOOL", [1], True),
}
BACKEND_OUTPUTS = {
    "text_output": ("TYPE_STRING", [-1]),
    "finish_reason": ("TYPE_STRING", [-1]),
    "cumulative_logprob": ("TYPE_FP32", [-1]),
    "logprobs": ("TYPE_STRING", [-1]),
    "num_input_tokens": ("TYPE_UINT32", [1]),
    "num_output_tokens": ("TYPE_UINT32", [-1]),
}
# What rsieve.adapters.model sends and reads on the vLLM path.
CLIENT_INPUTS = {
    "text_input",
    "image",
    "stream",
    "exclude_input_in_output",
    "sampling_parameters",
    "return_finish_reason",
    "return_num_input_tokens",
    "return_num_output_tokens",
}
CLIENT_OUTPUTS = {"text_output", "finish_reason", "num_input_tokens", "num_output_tokens"}
# vllm.AsyncEngineArgs fields the definitions use (model.json is passed as **kwargs).
ENGINE_ARGS = {
    "model",
    "tokenizer",
    "dtype",
    "max_model_len",
    "max_num_seqs",
    "gpu_memory_utilization",
    "tensor_parallel_size",
    "limit_mm_per_prompt",
    "mm_processor_kwargs",
    "enable_prefix_caching",
    "disable_log_stats",
    "trust_remote_code",
    "seed",
}


def config(folder: Path) -> mc.ModelConfig:
    return text_format.Parse((folder / "config.pbtxt").read_text(), mc.ModelConfig())


def inputs(cfg: mc.ModelConfig) -> dict[str, tuple[str, list[int], bool]]:
    return {t.name: (mc.DataType.Name(t.data_type), list(t.dims), t.optional) for t in cfg.input}


def outputs(cfg: mc.ModelConfig) -> dict[str, tuple[str, list[int]]]:
    return {t.name: (mc.DataType.Name(t.data_type), list(t.dims)) for t in cfg.output}


@pytest.mark.parametrize("name", ["vlm", "judge"])
def test_vllm_definition_matches_the_backend(name: str) -> None:
    cfg = config(VLLM / name)
    assert (cfg.name, cfg.backend, cfg.max_batch_size) == (name, "vllm", 0)
    assert cfg.model_transaction_policy.decoupled
    assert [g.kind for g in cfg.instance_group] == [mc.ModelInstanceGroup.KIND_MODEL]
    expected = dict(BACKEND_INPUTS)
    if name == "judge":
        del expected["image"]  # text only; the backend's auto-complete may add it back
    assert inputs(cfg) == expected
    assert outputs(cfg) == BACKEND_OUTPUTS
    assert CLIENT_INPUTS - ({"image"} if name == "judge" else set()) <= set(inputs(cfg))
    assert CLIENT_OUTPUTS <= set(outputs(cfg))


def test_vllm_engine_arguments() -> None:
    engines = {n: json.loads((VLLM / n / "1" / "model.json").read_text()) for n in ("vlm", "judge")}
    for name, args in engines.items():
        assert set(args) <= ENGINE_ARGS, f"{name}: not AsyncEngineArgs: {set(args) - ENGINE_ARGS}"
        assert Path(args["model"]).is_absolute() and args["tokenizer"] == args["model"]
        assert isinstance(args["max_model_len"], int) and args["max_model_len"] >= 2048
        assert args["trust_remote_code"] is False
    # One checkpoint, two engines, each on a GPU of its own (one Triton per role): each
    # leaves room for the CUDA context and graphs.
    assert engines["vlm"]["model"] == engines["judge"]["model"]
    assert engines["vlm"]["limit_mm_per_prompt"] == {"image": 1}
    assert engines["judge"]["limit_mm_per_prompt"] == {"image": 0}
    assert all(0 < e["gpu_memory_utilization"] <= 0.95 for e in engines.values())


def test_mimic_declares_exactly_the_vllm_interface() -> None:
    mimic, vlm = config(MIMIC), config(VLLM / "vlm")
    assert mimic.backend == "python" and mimic.name == "vllm-mimic"
    assert mimic.max_batch_size == vlm.max_batch_size == 0
    assert mimic.model_transaction_policy.decoupled
    assert inputs(mimic) == inputs(vlm) and outputs(mimic) == outputs(vlm)


def test_portable_hf_model_speaks_the_rsieve_interface() -> None:
    cfg = config(HF_VLM)
    assert (cfg.name, cfg.backend, cfg.max_batch_size) == ("vlm", "python", 16)
    assert cfg.HasField("dynamic_batching")
    assert inputs(cfg) == {
        "prompt": ("TYPE_STRING", [1], False),
        "image": ("TYPE_STRING", [1], True),
        "max_new_tokens": ("TYPE_INT32", [1], True),
    }
    assert outputs(cfg) == {
        "text": ("TYPE_STRING", [1]),
        "finish_reason": ("TYPE_STRING", [1]),
        "num_input_tokens": ("TYPE_INT32", [1]),
        "num_output_tokens": ("TYPE_INT32", [1]),
    }
    assert {"checkpoint", "max_new_tokens", "dtype"} <= set(cfg.parameters)
