"""The trainer export (`rsieve export RUN --format messages`, rsieve.dataset.trainer): card rows to
TRL's conversational rows (think: `<think>` block then the answer; nothink: the answer;
rejected: the reference, only when asked; ids back to the card row), and a committed
dataset in an in-memory store exported to a folder `datasets.load_dataset` reads."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import datasets
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from rsieve.adapters.exports import EmptyExport, export_dataset, export_messages
from rsieve.adapters.parquet import upload_splits
from rsieve.compact.compaction import next_manifest
from rsieve.compact.rows import assemble_rows
from rsieve.dataset.card import card_front_matter
from rsieve.dataset.trainer import (
    MESSAGES_FEATURES,
    assistant_text,
    card_kind,
    family_of,
    messages_rows,
    trainer_split,
)
from rsieve.judge.cascade import verify_generation
from rsieve.schemas import Outcome
from rsieve.settings import Settings
from tests.fakes import MemoryStore
from tests.unit._records import accepted, judged, make_generation, make_item, sha

REASONING = "I read the letters one by one."
DATASET = "trainer"


def _no_reasoning(item_id: str, image: str, answer: str) -> Outcome:
    item = make_item(item_id, line=5, question=f"Word {item_id}?", references=[answer], image=image)
    out = verify_generation(make_generation(item, answer, reasoning=None, raw_output=answer))
    assert out.place == "accepted" and not out.generation.reasoning
    return out


def outcomes() -> list[Outcome]:
    """Two images of SynthWords (one with two questions), one of ORAND-CAR-A: accepted with
    reasoning, accepted on the first line of a longer answer, accepted without reasoning
    (nothink only), and one the verifier and the judge rejected."""
    return [
        accepted(make_item("w-1", line=1, question="Word one?", image="img-a")),
        accepted(
            make_item("w-2", line=2, question="Word two?", references=["TEA"], image="img-a"),
            "TEA\nThe image shows tea.",
        ),
        _no_reasoning("w-3", "img-b", "MILK"),
        judged(
            make_item("w-4", line=4, question="Word four?", references=["JUICE"], image="img-b"),
            "nothing",
            "WRONG",
        ),
        accepted(
            make_item(
                "c-1",
                line=6,
                family="ORAND-CAR-A",
                protocol="alnum",
                question="Amount?",
                references=["1250"],
                image="img-c",
            )
        ),
    ]


def _png(name: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 20), (hash(name) % 256, 80, 160)).save(buf, format="PNG")
    return buf.getvalue()


def _with_image(row: dict[str, Any]) -> dict[str, Any]:
    return row | {"image": {"bytes": b"png", "path": row["image_sha256"]}}


# --------------------------------------------------------------------------- pure rows


def test_think_rows_hold_the_reasoning_then_the_answer() -> None:
    rows = assemble_rows(outcomes(), "run-1")["SynthWords_RS_think"]
    out = [
        r
        for row in rows
        for r in messages_rows(_with_image(row), "SynthWords_RS_think", family="SynthWords")
    ]
    assert [r["id"] for r in out] == ["w-1", "w-2"]  # w-3 has no reasoning: nothink only
    first = out[0]
    assert first["messages"] == [
        {
            "role": "user",
            "content": [{"type": "image", "text": None}, {"type": "text", "text": "Word one?"}],
        },
        {
            "role": "assistant",
            "content": [{"type": "text", "text": f"<think>\n{REASONING}\n</think>\n\nCOFFEE"}],
        },
    ]
    # The target is the form that passed: the first line of w-2's answer.
    assert out[1]["messages"][1]["content"][0]["text"].endswith("</think>\n\nTEA")
    assert first["images"] == [{"bytes": b"png", "path": sha("img-a")}]
    assert {r["kind"] for r in out} == {"think"} and {r["family"] for r in out} == {"SynthWords"}


def test_nothink_rows_hold_the_answer_alone() -> None:
    rows = assemble_rows(outcomes(), "run-1")["SynthWords_RS_nothink"]
    out = [
        r
        for row in rows
        for r in messages_rows(_with_image(row), "SynthWords_RS_nothink", family="SynthWords")
    ]
    targets = {r["id"]: r["messages"][1]["content"][0]["text"] for r in out}
    assert targets == {"w-1": "COFFEE", "w-2": "TEA", "w-3": "MILK"}
    assert all("<think>" not in t for t in targets.values())
    assert {r["kind"] for r in out} == {"nothink"}


def test_rejected_rows_only_when_asked_with_the_reference() -> None:
    (row,) = assemble_rows(outcomes(), "run-1")["SynthWords_rejected"]
    assert messages_rows(_with_image(row), "SynthWords_rejected", family="SynthWords") == []
    (out,) = messages_rows(
        _with_image(row), "SynthWords_rejected", family="SynthWords", include_rejected=True
    )
    assert out["id"] == "w-4" and out["kind"] == "rejected"
    assert out["messages"][1]["content"] == [{"type": "text", "text": "JUICE"}]  # not "nothing"


def test_ids_lead_back_to_the_card_row() -> None:
    splits = assemble_rows(outcomes(), "run-1")
    for split, rows in splits.items():
        for row in rows:
            out = messages_rows(
                _with_image(row), split, family=family_of(split), include_rejected=True
            )
            assert len(out) == len(row["qa"])
            for r in out:
                assert r["source_split"] == split and r["run"] == "run-1"
                assert r["image_sha256"] == row["image_sha256"]
                assert row["qa"][r["qa_index"]]["id"] == r["id"]
                assert (
                    r["messages"][0]["content"][1]["text"] == row["qa"][r["qa_index"]]["question"]
                )
    datasets.Dataset.from_list(out, features=MESSAGES_FEATURES)  # the rows fit the features


def test_split_names_kinds_and_families() -> None:
    assert card_kind("ORAND_CAR_A_RS_nothink") == "RS_nothink"
    assert trainer_split("ORAND_CAR_A_RS_think") == "think"
    assert trainer_split("X_rejected") == "rejected"
    assert family_of("ORAND_CAR_A_RS_think", ["SynthWords", "ORAND-CAR-A"]) == "ORAND-CAR-A"
    assert family_of("ORAND_CAR_A_RS_think") == "ORAND_CAR_A"
    with pytest.raises(ValueError):
        card_kind("SynthWords_train")
    assert assistant_text({"answer": "A", "reasoning": None}, "nothink") == "A"


# --------------------------------------------------------------------------- a real export


def commit(store: MemoryStore, runs: list[tuple[str, list[Outcome]]]) -> None:
    """What the compactor commits for each run (shards, reports, manifest), in row groups
    of one row and parts of at most 1 KiB so the export reads and writes several."""
    settings = Settings(parquet_row_group_rows=1, parquet_shard_bytes=1024)
    prefix = f"datasets/{DATASET}/"
    manifest: dict[str, Any] | None = None
    images = {sha(n): _png(n) for n in ("img-a", "img-b", "img-c", "img-d")}
    for run, outs in runs:
        rows = assemble_rows(outs, run)
        shards = upload_splits(store, prefix, run, rows, images.__getitem__, settings)
        manifest = next_manifest(manifest, dataset=DATASET, run=run, shards=shards, adds_up=True)
        families: dict[str, dict[str, int]] = {o.generation.item.family: {} for o in outs}
        report = json.dumps({"run": run, "families": families}).encode()
        card = f"---\n{yaml.safe_dump(card_front_matter(manifest))}---\n".encode()
        files = {"README.md": card, "run_report.json": report, "quarantine.jsonl": b""}
        for name in set(manifest["files"].values()) - {s["path"] for s in manifest["shards"]}:
            if not store.exists(prefix + name):  # an earlier commit's files stay its own
                store.put(prefix + name, files.get(name.rsplit("/", 1)[-1], b"{}"))
        store.put(prefix + "manifest.json", json.dumps(manifest).encode())


@pytest.fixture
def store() -> MemoryStore:
    store = MemoryStore()
    second = accepted(make_item("w-9", line=9, question="Word nine?", image="img-d"))
    commit(store, [("run-1", outcomes()), ("run-2", [second])])
    return store


def test_an_export_loads_with_datasets_and_links_back_to_the_card_format(
    store: MemoryStore, tmp_path: Path
) -> None:
    folder = export_messages(store, DATASET, tmp_path, group_rows=1, shard_bytes=1024)
    assert folder == tmp_path / f"{DATASET}-messages"
    assert not list(tmp_path.glob(".*partial"))
    parts = sorted(p.name for p in (folder / "data").glob("*.parquet"))
    assert {p.split("-")[0] for p in parts} == {"think", "nothink"}
    assert len([p for p in parts if p.startswith("nothink-")]) > 1  # parts closed past 1 KiB
    front = yaml.safe_load((folder / "README.md").read_text().split("---\n")[1])
    assert [s["split"] for s in front["configs"][0]["data_files"]] == ["think", "nothink"]

    ds = datasets.load_dataset(str(folder))
    assert set(ds) == {"think", "nothink"}
    assert ds["think"].features == MESSAGES_FEATURES
    think, nothink = ds["think"], ds["nothink"]
    assert sorted(think["id"]) == ["c-1", "w-1", "w-2", "w-9"]
    assert sorted(nothink["id"]) == ["c-1", "w-1", "w-2", "w-3", "w-9"]
    row = next(r for r in think if r["id"] == "c-1")
    assert row["family"] == "ORAND-CAR-A" and row["source_split"] == "ORAND_CAR_A_RS_think"
    assert isinstance(row["images"][0], Image.Image) and row["images"][0].size == (40, 20)
    assert row["messages"][1]["content"][0]["text"] == f"<think>\n{REASONING}\n</think>\n\n1250"
    assert {r for r in think["run"]} == {"run-1", "run-2"}

    # Every row leads back to its entry in the card-format export of the same dataset.
    card = datasets.load_dataset(str(export_dataset(store, DATASET, tmp_path)))
    for split in (think, nothink):
        for r in split.remove_columns("images"):
            (card_row,) = [
                c
                for c in card[r["source_split"]].remove_columns("image")
                if c["image_sha256"] == r["image_sha256"]
            ]
            qa = card_row["qa"][r["qa_index"]]
            assert qa["id"] == r["id"] and card_row["clean_meta"]["run"] == r["run"]
            assert r["messages"][0]["content"][1]["text"] == qa["question"]
            assert r["messages"][1]["content"][0]["text"].endswith(qa["answer"])


def test_rejected_split_only_with_include_rejected(store: MemoryStore, tmp_path: Path) -> None:
    ds = datasets.load_dataset(
        str(export_messages(store, DATASET, tmp_path, include_rejected=True))
    )
    assert set(ds) == {"think", "nothink", "rejected"}
    (row,) = ds["rejected"].remove_columns("images")
    assert row["id"] == "w-4" and row["messages"][1]["content"][0]["text"] == "JUICE"


def test_nothing_accepted_is_an_error_unless_rejected_are_asked_for(tmp_path: Path) -> None:
    store = MemoryStore()
    rejected = judged(make_item("w-4", references=["JUICE"], image="img-b"), "nothing", "WRONG")
    commit(store, [("run-1", [rejected])])
    with pytest.raises(EmptyExport, match="no accepted rows"):
        export_messages(store, DATASET, tmp_path)
    folder = export_messages(store, DATASET, tmp_path, include_rejected=True)
    assert set(datasets.load_dataset(str(folder))) == {"rejected"}


def test_the_export_command_writes_either_format(
    store: MemoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rsieve_cli.app as cli
    import rsieve_cli.shell as shell

    ctx = SimpleNamespace(
        store=store, settings=Settings(parquet_row_group_rows=2, parquet_shard_bytes=1 << 20)
    )
    monkeypatch.setattr(shell, "context", lambda: ctx)
    monkeypatch.setattr(shell, "spec_or_fail", lambda ctx, run: SimpleNamespace(dataset=DATASET))
    runner = CliRunner()
    out = runner.invoke(cli.app, ["export", "run-2", "--to", str(tmp_path), "--format", "messages"])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == str(tmp_path / f"{DATASET}-messages")
    out = runner.invoke(cli.app, ["export", "run-2", "--to", str(tmp_path)])
    assert out.exit_code == 0 and out.output.strip() == str(tmp_path / DATASET)
    assert (tmp_path / DATASET / "manifest.json").is_file()
    out = runner.invoke(cli.app, ["export", "run-2", "--to", str(tmp_path), "--include-rejected"])
    assert out.exit_code == 1 and "--format messages only" in out.output
    out = runner.invoke(cli.app, ["export", "run-2", "--to", str(tmp_path), "--format", "jsonl"])
    assert out.exit_code == 1 and "unknown format 'jsonl'" in out.output
