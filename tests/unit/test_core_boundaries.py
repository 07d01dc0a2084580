"""The import direction (CONTRIBUTING.md): services and rsieve_cli -> rsieve.adapters ->
the rsieve core. The core is rules only: no I/O, no vendor client, nothing from a shell."""

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


def imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (function-level imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def banned(module: str, names: set[str]) -> bool:
    return any(module == n or module.startswith(n + ".") for n in names)


def core_modules() -> list[Path]:
    return [
        p
        for p in sorted(CORE.rglob("*.py"))
        if not SHELL_PARTS & set(p.relative_to(CORE).parts[:-1])
    ]


def test_the_core_is_found() -> None:
    names = {p.name for p in core_modules()}
    assert {"verify.py", "cleaning.py", "rows.py", "schemas.py"} <= names
    assert "storage.py" not in names and "stack.py" not in names


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
