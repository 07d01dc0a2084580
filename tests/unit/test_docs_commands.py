"""scripts/check_docs.py (run by `make lint`): every `make` target, `rsieve` command,
`python -m` module and path of this repository that the docs name in code exists, and so
does every dotted name of its code that the docs or a docstring or comment names."""

from __future__ import annotations

from pathlib import Path

from scripts.check_docs import (
    ROOT,
    Known,
    documents,
    known,
    sources,
    unknown_in_source,
    unknown_references,
)

FAKE = Known(
    targets=frozenset({"test", "lint"}),
    commands={"run": frozenset(), "stack": frozenset({"up", "down"})},
    modules=frozenset({"bench.bench_streams", "scripts.reward_parity"}),
    root=ROOT,
)


def _flagged(text: str) -> list[str]:
    return [u.what for u in unknown_references("doc.md", text, FAKE)]


def test_what_exists_passes() -> None:
    text = (
        "Run `make test`, then `rsieve run POOL --out DIR` and `rsieve stack up`.\n\n"
        "```bash\npython -m bench.bench_streams --items 10\n$ rsieve stack down\n```\n\n"
        "See `scripts/check_docs.py`, `docs/training.md` and `tests/unit/`."
    )
    assert _flagged(text) == []


def test_what_does_not_exist_is_named_with_its_line() -> None:
    text = (
        "`make install`\n\n"
        "```bash\nrsieve frobnicate RUN\nrsieve stack sideways\n"
        "python -m scripts.not_there\n```\n\n"
        "and `docs/not-there.md`."
    )
    found = unknown_references("doc.md", text, FAKE)
    assert [(u.what, u.line) for u in found] == [
        ("make install", 1),
        ("rsieve frobnicate", 4),
        ("rsieve stack sideways", 5),
        ("python -m scripts.not_there", 6),
        ("docs/not-there.md", 9),
    ]


def test_what_is_not_a_reference_to_this_repository_is_left_alone() -> None:
    text = (
        "```bash\nkubectl -n rsieve get pods\n"
        "cp deploy/k8s/secrets.env.example deploy/k8s/overlays/gpu/.env\n"
        "python -m verl.trainer.main_ppo\npython -m services.SERVICE\n```\n\n"
        "Prose mentions of make targets or rsieve run outside code are not read; "
        "the backend's `docs/additional_outputs.md` is another project's; "
        "`tests/unit/cases/conformance_<name>.jsonl` is a pattern; "
        "`bench/results.json` is made by a bench run and ignored by git."
    )
    assert _flagged(text) == []


def test_the_repositorys_docs_name_only_what_exists() -> None:
    facts = known()
    assert "lint" in facts.targets and "export" in facts.commands
    assert "scripts.check_docs" in facts.modules
    docs = list(documents())
    assert Path(ROOT / "docs" / "training.md") in docs and len(docs) > 10
    problems = [u for path in docs for u in unknown_references(path.name, path.read_text(), facts)]
    problems += [
        u for path in sources() for u in unknown_in_source(path.name, path.read_text(), facts)
    ]
    assert problems == []


def _with_module(tmp_path: Path) -> Known:
    """A repository of one module, services/runs.py, with a function and a class."""
    source = tmp_path / "services" / "runs.py"
    source.parent.mkdir()
    source.write_text(
        "from rsieve.keys import spec_key as key\n"
        "LIMIT = 3\n"
        "def resume(run): ...\n"
        "class Runs:\n    kept: int\n    def create(self): ...\n"
    )
    (tmp_path / "services" / "__init__.py").write_text("")
    modules = {"services": tmp_path / "services" / "__init__.py", "services.runs": source}
    return Known(frozenset(), {}, frozenset(modules), tmp_path, modules)


def test_a_dotted_name_must_be_defined_where_it_says(tmp_path: Path) -> None:
    facts = _with_module(tmp_path)
    text = (
        "`services.runs.resume`, `services.runs.LIMIT`, `services.runs.key`,\n"
        "`services.runs.Runs.create`, `services.runs.Runs.kept` and `services.runs`.\n"
        "Gone: `services.runs.reconcile`, `services.runs.Runs.delete`, `services.common.bootstrap`."
    )
    assert [u.what for u in unknown_references("doc.md", text, facts)] == [
        "services.runs.reconcile",
        "services.runs.Runs.delete",
        "services.common.bootstrap",
    ]


def test_docstrings_and_comments_are_read_and_code_is_not(tmp_path: Path) -> None:
    facts = _with_module(tmp_path)
    source = (
        '"""Resumes by services.runs.resume, once services.runs.gone moved."""\n'
        "services = {}\n"
        "services.items()  # the dict's, not a module's: code is mypy's\n"
        "def f():\n"
        '    """As services.runs.Runs.create does."""\n'
        "    # see services.runs.vanished\n"
        '    return "rsieve.ingest"  # a Celery task name: rsieve.ingest\n'
    )
    found = unknown_in_source("x.py", source, facts)
    assert [(u.what, u.line) for u in found] == [
        ("services.runs.vanished", 6),
        ("services.runs.gone", 1),
    ]
