"""What a regular (not editable) install of the project holds: the images install it with
`pip install .`, where a package folder missing from pyproject.toml's list is simply absent
(an editable install, as in `make install`, would hide that)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def package_folders() -> set[str]:
    """Every folder with an __init__.py under the folders pyproject.toml maps, as a dotted name."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for top, folder in config["package-dir"].items():
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            found.add(".".join((top, *init.parent.relative_to(root).parts)))
    return found


def test_every_package_folder_is_installed() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    assert package_folders() == listed, {
        "not installed": sorted(package_folders() - listed),
        "listed, no folder": sorted(listed - package_folders()),
    }
