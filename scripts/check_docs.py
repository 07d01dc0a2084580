"""Do the commands and files the docs name exist? Run by `make lint`.

    .venv/bin/python -m scripts.check_docs

Reads README.md, CONTRIBUTING.md, docs/*.md, bench/README.md and every README.md under
deploy/, and checks, in code spans and code blocks only:

- `make TARGET`: a target of the Makefile;
- `rsieve COMMAND [SUBCOMMAND]`: a command of the command line (`rsieve_cli.app`);
- `python -m MODULE`: a module of this repository (bench, scripts, services, rsieve, ...);
- a path of this repository's own folders (`scripts/x.py`, `bench/x.py`, `tests/...`,
  `docs/x.md`, `deploy/...`): a file or folder that exists;
- a dotted name under a module of this repository (`rsieve.dataset.card.render_card`,
  `services.stage.StageTask.retry_after`): the module, and the name defined at its top
  level (a class's member too, one level down).

Dotted names are also checked in every Python file's text (docstrings and comments), so a
docstring cannot go on naming a module or function that moved. A name whose only module is
`rsieve` itself (`rsieve.ingest`) is a Celery task's or a logger's name, not code, and is
left alone; under the other packages such a name must be a module.

Prints each reference that does not resolve, with its file and line; exit 1 if any.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import sys
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "CONTRIBUTING.md", "docs/*.md", "bench/README.md", "deploy/**/README.md")
# Folders of this repository whose paths the docs name.
OWN = ("scripts/", "bench/", "tests/", "docs/", "deploy/", "services/", "shared/")
# The top-level packages of this repository a `python -m` may name (others are a trainer's
# or a tool's: verl, pip).
PACKAGES = ("bench", "scripts", "services", "rsieve", "rsieve_cli", "tests")
# The Python files whose docstrings and comments are checked for dotted names.
SOURCES = (
    "shared/**/*.py",
    "services/**/*.py",
    "tests/**/*.py",
    "bench/**/*.py",
    "scripts/**/*.py",
)

_CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)
_MAKE = re.compile(r"(?<![\w-])make\s+([a-z][\w-]*)")
# `rsieve` as a command: at the start of a span or a line, or after a shell operator or a
# prompt (not `kubectl -n rsieve get`, where it is a namespace).
_RSIEVE = re.compile(r"(?:^|\n|[$;|&(]\s*)\s*rsieve\s+([a-z][\w-]*)(?:[ \t]+([a-z][\w-]*))?")
_MODULE = re.compile(r"python3?\s+-m\s+([\w.]+)")
_DOTTED = re.compile(r"(?<![\w./-])((?:" + "|".join(PACKAGES) + r")(?:\.\w+)+)")
# What follows a dotted name when it is a file's name, not code (`rsieve.yaml`).
_SUFFIXES = frozenset({"py", "md", "json", "jsonl", "yaml", "yml", "txt", "toml", "parquet"})
_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(map(re.escape, OWN)) + r")[\w./-]*[\w/])")


@dataclass(frozen=True)
class Known:
    """What exists: make targets, CLI commands (top-level -> subcommands), modules, and a
    test for paths."""

    targets: frozenset[str]
    commands: dict[str, frozenset[str]]
    modules: frozenset[str]
    root: Path
    files: dict[str, Path] | None = None  # module -> its source, for dotted names


@dataclass(frozen=True)
class Unknown:
    file: str
    line: int
    what: str


def code_spans(text: str) -> Iterator[tuple[int, str, str]]:
    """Each code span or block of a markdown text: the line it starts on, its text, and
    the three characters before it."""
    for m in _CODE.finditer(text):
        yield (
            text.count("\n", 0, m.start()) + 1,
            m.group(0).strip("`"),
            text[max(0, m.start() - 3) : m.start()],
        )


def _copied_to(code: str, start: int, end: int) -> bool:
    """The path at [start, end) is the destination of a `cp` or `mv` (a file made there)."""
    line_start = code.rfind("\n", 0, start) + 1
    line_end = code.find("\n", end)
    line = code[line_start : len(code) if line_end < 0 else line_end]
    words = line.split("#", 1)[0].split()
    return bool(words) and words[0] in ("cp", "mv") and code[start:end] == words[-1]


def unknown_references(name: str, text: str, known: Known) -> list[Unknown]:
    """The references of one document that do not resolve (module docstring). A span
    right after "'s " names another project's file (vllm_backend's `docs/...`)."""
    out: list[Unknown] = []
    for first, code, before in code_spans(text):

        def at(pos: int, first: int = first, code: str = code) -> int:
            return first + code.count("\n", 0, pos)

        for m in _MAKE.finditer(code):
            if m[1] not in known.targets:
                out.append(Unknown(name, at(m.start()), f"make {m[1]}"))
        for m in _RSIEVE.finditer(code):
            command, sub = m[1], m[2]
            if command not in known.commands:
                out.append(Unknown(name, at(m.start(1)), f"rsieve {command}"))
            elif known.commands[command] and sub and sub not in known.commands[command]:
                out.append(Unknown(name, at(m.start(1)), f"rsieve {command} {sub}"))
        for m in _DOTTED.finditer(code):
            if code[: m.start()].endswith("-m "):  # `python -m`'s, checked below
                continue
            if not dotted_resolves(m[1], known):
                out.append(Unknown(name, at(m.start()), m[1]))
        for m in _MODULE.finditer(code):
            module = m[1].rstrip(".")
            if module.split(".")[0] not in PACKAGES or not module.islower():
                continue
            if module not in known.modules:
                out.append(Unknown(name, at(m.start()), f"python -m {module}"))
        if before.endswith("'s "):
            continue
        for m in _PATH.finditer(code):
            path = m[1]
            following = code[m.end() : m.end() + 1]
            if following in ("<", "{", "*") or _copied_to(code, m.start(1), m.end(1)):
                continue
            if not (known.root / path).exists() and not _ignored(known.root, path):
                out.append(Unknown(name, at(m.start()), path))
    return out


def dotted_resolves(dotted: str, known: Known) -> bool:
    """Whether a dotted name of this repository's code exists (module docstring); a name
    outside its modules, or under a top-level package only, is not a reference here."""
    parts = dotted.rstrip(".").split(".")
    depth = next((i for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in known.modules), 0)
    if depth == 0 or depth == len(parts) or parts[depth] in _SUFFIXES:
        return True
    if depth == 1 and parts[0] == "rsieve":  # the Celery tasks' and loggers' namespace
        return True
    source = (known.files or {}).get(".".join(parts[:depth]))
    if source is None:
        return True
    defined = _defined(source)
    attr = parts[depth]
    if attr not in defined:
        return False
    member = parts[depth + 1] if depth + 1 < len(parts) else None
    members = defined[attr]
    return member is None or members is None or member in members or member in _SUFFIXES


@functools.cache
def _defined(source: Path) -> dict[str, frozenset[str] | None]:
    """The names a module defines at its top level; a class's maps to its members (methods,
    fields), anything else to None (not looked into)."""
    names: dict[str, frozenset[str] | None] = {}
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.ClassDef):
            members = {
                t.id
                for sub in node.body
                for t in (
                    sub.targets
                    if isinstance(sub, ast.Assign)
                    else [sub.target]
                    if isinstance(sub, ast.AnnAssign)
                    else []
                )
                if isinstance(t, ast.Name)
            }
            members |= {
                sub.name
                for sub in node.body
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            }
            # A base class's members are not followed: a member not found is allowed then.
            names[node.name] = frozenset(members) if not node.bases else None
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = None
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        names[n.id] = None
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = None
        elif isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING imports, fallbacks
            for sub in ast.walk(node):
                if isinstance(sub, ast.Import | ast.ImportFrom):
                    for alias in sub.names:
                        names[(alias.asname or alias.name).split(".")[0]] = None
                elif isinstance(sub, ast.FunctionDef | ast.ClassDef):
                    names[sub.name] = None
    return names


def prose(text: str) -> Iterator[tuple[int, str]]:
    """A Python file's docstrings and comments, each with the line it starts on (the code
    itself is checked by mypy, and a name there may be a variable's)."""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    yield body[0].lineno, body[0].value.value


def unknown_in_source(name: str, text: str, known: Known) -> list[Unknown]:
    """The dotted names of a Python file's docstrings and comments that do not resolve."""
    return [
        Unknown(name, line + part.count("\n", 0, m.start()), m[1])
        for line, part in prose(text)
        for m in _DOTTED.finditer(part)
        if not dotted_resolves(m[1], known)
    ]


def _ignored(root: Path, path: str) -> bool:
    """A file the tree makes and git ignores (bench/results.json): named, never committed."""
    import fnmatch

    patterns = [
        p.strip().rstrip("/")
        for p in (root / ".gitignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    return any(fnmatch.fnmatch(path, p) or path.startswith(p + "/") for p in patterns)


def _modules(root: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for base, prefix in ((root, ""), (root / "shared", "")):
        for path in base.rglob("*.py"):
            if ".venv" in path.parts or "var" in path.parts[len(base.parts) : len(base.parts) + 1]:
                continue
            rel = path.relative_to(base).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__main__":
                parts = parts[:-1]
            elif parts[-1] == "__init__":
                parts = parts[:-1]
            if parts:
                found[prefix + ".".join(parts)] = path
    return found


def _commands() -> dict[str, frozenset[str]]:
    import typer

    from rsieve_cli.app import app

    group = typer.main.get_command(app)
    return {
        name: frozenset(getattr(cmd, "commands", None) or ())
        for name, cmd in getattr(group, "commands", {}).items()
    }


def known(root: Path = ROOT) -> Known:
    makefile = (root / "Makefile").read_text()
    targets = frozenset(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    modules = _modules(root)
    return Known(targets, _commands(), frozenset(modules), root, modules)


def documents(root: Path = ROOT) -> Iterable[Path]:
    seen: set[Path] = set()
    for pattern in DOCS:
        for path in sorted(root.glob(pattern)):
            if path not in seen and ".venv" not in path.parts:
                seen.add(path)
                yield path


def sources(root: Path = ROOT) -> Iterable[Path]:
    for pattern in SOURCES:
        for path in sorted(root.glob(pattern)):
            if ".venv" not in path.parts:
                yield path


def main() -> int:
    facts = known()
    problems = [
        u
        for path in documents()
        for u in unknown_references(str(path.relative_to(ROOT)), path.read_text(), facts)
    ] + [
        u
        for path in sources()
        for u in unknown_in_source(str(path.relative_to(ROOT)), path.read_text(), facts)
    ]
    for u in problems:
        print(f"{u.file}:{u.line}: `{u.what}` does not exist")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
