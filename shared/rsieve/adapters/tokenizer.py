"""Loading a checkpoint's tokenizer (files only, never weights) as an
`rsieve.generate.chat.ChatTemplate`.

`path` is a Hugging Face checkpoint folder (its `chat_template.jinja`, the `chat_template`
of `tokenizer_config.json`, or a processor's `chat_template.json`) or a `.gguf` file (its
embedded template; transformers reads GGUF tokenizers with the `gguf` package). Nothing is
downloaded: the hub is never asked (`local_files_only`). Loaded once per process and path.
"""

from __future__ import annotations

import contextlib
import functools
import json
from pathlib import Path
from typing import Any

from rsieve.generate.chat import ChatTemplate, TemplateError

__all__ = ["load_chat_template", "preload_chat_template", "special_tokens"]


def special_tokens(tokenizer: Any) -> tuple[str, ...]:
    """Every special and added token the tokenizer matches in text."""
    found = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        found.add(str(getattr(token, "content", token)))
    return tuple(sorted(found))


def _source(tokenizer: Any, folder: Path) -> str:
    source = getattr(tokenizer, "chat_template", None)
    if isinstance(source, dict):  # named templates: the default one
        source = source.get("default")
    if not source:
        for name in ("chat_template.jinja", "chat_template.json"):
            candidate = folder / name
            if candidate.is_file():
                text = candidate.read_text(encoding="utf-8")
                source = json.loads(text)["chat_template"] if name.endswith(".json") else text
                break
    if not source:
        raise TemplateError(f"{folder}: the checkpoint has no chat template")
    return str(source)


@functools.lru_cache(maxsize=8)
def load_chat_template(path: str) -> ChatTemplate:
    from transformers import AutoTokenizer

    where = Path(path).expanduser()
    if where.is_file() and where.suffix == ".gguf":
        tokenizer = AutoTokenizer.from_pretrained(
            str(where.parent), gguf_file=where.name, local_files_only=True
        )
        folder, name = where.parent, where.stem
    elif where.is_dir():
        tokenizer = AutoTokenizer.from_pretrained(str(where), local_files_only=True)
        folder, name = where, where.name
    else:
        raise TemplateError(f"{path}: no checkpoint folder or .gguf file there")
    source = _source(tokenizer, folder)

    def render(messages: list[dict[str, Any]], **kwargs: Any) -> str:
        return str(
            tokenizer.apply_chat_template(messages, chat_template=source, tokenize=False, **kwargs)
        )

    return ChatTemplate(
        name=name, source=source, render_fn=render, specials=special_tokens(tokenizer)
    )


def preload_chat_template(path: str) -> None:
    """Load `path` at a worker's start, so the first shard does not pay for importing
    transformers (about 1 s of CPU) and the template. A path that does not load is left for
    the first request to report, as it would have without this."""
    if path:
        with contextlib.suppress(TemplateError, OSError, ValueError):
            load_chat_template(path)
