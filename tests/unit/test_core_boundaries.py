"""The import direction (CONTRIBUTING.md): services and rsieve_cli -> rsieve.adapters ->
the rsieve core. The core is rules only: no I/O, no vendor client, nothing from a shell.
Inside the core, the stage packages are layers in pipeline order: a stage imports only the
base (the modules directly under rsieve, and the settings package) and earlier stages, and
the base imports no stage."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "shared" / "rsieve"
SHELL_PARTS = {"adapters"}  # the shell inside the rsieve package
# Clients of networks, queues, servers and processes; each is banned by ruff in the core.
VENDOR = {
    "redis",
    "boto3",
    "botocore",
    "tritonclient",
    "grpc",
    "celery",
    "kombu",
    "fastapi",
    "starlette",
    "uvicorn",
    "httpx",
    "requests",
    "urllib.request",
    "urllib3",
    "aiohttp",
    "prometheus_client",
    "subprocess",
    "socket",
    "typer",
    "rich",
}
SHELLS = {"services", "rsieve_cli"}
# The core's stage packages in pipeline order (verification's rules are the base's
# rsieve.verify: cleaning, settings and every later stage use its protocol registry).
# `rewards` (the verifiers as RL rewards) reads answers with generate's parse and no later
# stage's rules, so a reward never depends on the judge; dataset's exports encode with it.
STAGES = ("run", "clean", "generate", "rewards", "judge", "compact", "dataset")
# Packages of the base: the settings, one module per concern.
BASE_PACKAGES = ("settings",)


def imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (function-level imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def relative_imports(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]


def layer(parts: tuple[str, ...]) -> int:
    """A core module's place: -1 for the base, else its stage's index in STAGES."""
    return STAGES.index(parts[0]) if len(parts) > 1 and parts[0] not in BASE_PACKAGES else -1


def layering_violations(module_parts: tuple[str, ...], imported: set[str]) -> list[str]:
    """The rsieve modules `imported` that a module at `module_parts` (its path under
    rsieve, e.g. ("judge", "cascade.py")) may not import: a later stage, or any stage from
    the base."""
    own = layer(module_parts)
    bad = []
    for name in imported:
        parts = name.split(".")
        if parts[0] != "rsieve" or len(parts) < 2 or parts[1] not in STAGES:
            continue
        if STAGES.index(parts[1]) > own:
            bad.append(name)
    return sorted(bad)


def banned(module: str, names: set[str]) -> bool:
    return any(module == n or module.startswith(n + ".") for n in names)


def core_modules() -> list[Path]:
    return [
        p
        for p in sorted(CORE.rglob("*.py"))
        if not SHELL_PARTS & set(p.relative_to(CORE).parts[:-1])
    ]


def test_the_core_is_found() -> None:
    found = {str(p.relative_to(CORE)) for p in core_modules()}
    names = {p.name for p in core_modules()}
    assert {"verify.py", "cleaning.py", "rows.py", "schemas.py"} <= names
    assert {"settings/__init__.py", "settings/work.py"} <= found
    assert "adapters/storage.py" not in found and "stack.py" not in names


@pytest.mark.parametrize("path", core_modules(), ids=lambda p: str(p.relative_to(CORE)))
def test_core_module_imports_no_vendor_client_and_no_shell(path: Path) -> None:
    bad = sorted(m for m in imports(path) if banned(m, VENDOR | SHELLS))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}: move the I/O to rsieve.adapters"


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: str(p.relative_to(CORE)))
def test_no_rsieve_module_imports_services_or_the_cli(path: Path) -> None:
    bad = sorted(m for m in imports(path) if banned(m, SHELLS))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}: the core never depends on a shell"


def test_the_detector_sees_deep_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f():\n    from services.common import bootstrap\n    import boto3.session\n"
    )
    assert banned("services.common", SHELLS) and banned("boto3.session", VENDOR | {"boto3"})
    assert {"services.common", "boto3.session"} <= imports(probe)


def test_ruff_bans_every_vendor_client_and_shell_in_the_core() -> None:
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert set(lint["flake8-tidy-imports"]["banned-api"]) >= VENDOR | SHELLS
    ignores = lint["per-file-ignores"]
    core_ignored = [
        glob
        for glob, rules in ignores.items()
        if "TID251" in rules
        and glob.startswith("shared/rsieve/")
        and glob.split("/")[2] not in SHELL_PARTS
    ]
    assert not core_ignored, f"the ban is lifted in the core: {core_ignored}"


def test_every_core_folder_is_a_stage_in_the_order() -> None:
    folders = {p.name for p in CORE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders - SHELL_PARTS - set(BASE_PACKAGES) == set(STAGES), (
        "a new stage folder needs its place in STAGES"
    )


@pytest.mark.parametrize("path", core_modules(), ids=lambda p: str(p.relative_to(CORE)))
def test_a_stage_imports_only_the_base_and_earlier_stages(path: Path) -> None:
    parts = path.relative_to(CORE).parts
    bad = layering_violations(parts, imports(path))
    where = "the base" if layer(parts) < 0 else f"stage {parts[0]}"
    assert not bad, f"{path.relative_to(ROOT)} ({where}) imports {bad}: a later stage"
    assert not relative_imports(path), "the core imports absolutely, so the layering is seen"


def test_the_layering_detector_sees_a_later_stage() -> None:
    assert layering_violations(("clean", "cleaning.py"), {"rsieve.judge.verdicts"}) == [
        "rsieve.judge.verdicts"
    ]
    assert layering_violations(("schemas.py",), {"rsieve.run.packs", "rsieve.verify"}) == [
        "rsieve.run.packs"
    ]
    assert not layering_violations(
        ("dataset", "card.py"), {"rsieve.judge.verdicts", "rsieve.compact.rows", "rsieve.verify"}
    )
    assert not layering_violations(("judge", "cascade.py"), {"rsieve.judge", "pydantic"})


# What a process of a service imports as it starts: `datasets` (with pandas, about 0.8 s
# of CPU) only where rows or exports are written. Every worker of every stack the suite
# starts, and every worker a deployment scales out, pays what its import costs.
HEAVY = ("datasets", "pandas", "torch", "transformers")


@pytest.mark.parametrize(
    "module",
    [
        "services.cleaner.tasks",
        "services.cleaner.beat",
        "services.generator.tasks",
        "services.verifier.tasks",
        "services.judge.tasks",
        "services.api.main",
    ],
)
def test_a_service_that_writes_no_rows_does_not_import_datasets(module: str) -> None:
    import subprocess
    import sys

    probe = f"import sys, {module}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.split() == [], f"{module} imports {out.stdout.strip()}"
