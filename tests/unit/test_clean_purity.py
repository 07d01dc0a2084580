"""Task purity: templates, the family's dominant form, the embedding model for the rest,
the threshold, and the whole-pool decisions of the ingest rounds, run in process
(duplicates, refused files, purity verdicts, cleaning.json)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np
import pytest

from rsieve.clean import purity
from rsieve.clean.cleaning import render_cleaning
from rsieve.clean.purity import PurityQuestion, measure_purity, question_core
from tests.unit.test_purity_origin import ingest_pool

POOL_PHRASING = [
    "Type out the lettering visible in this crop.",
    "Type out the lettering you can see in this crop.",
    "Please type out the lettering in this crop.",
]
GENERAL_VQA = [
    "What colour is the background?",
    "How many people are in the picture?",
    "Describe the image.",
    "Is this photo taken at night?",
    "What is the main object in the picture?",
    "Who is standing next to the car?",
]


def _bag_of_words(texts: Sequence[str]) -> np.ndarray:
    """A stand-in embedder for fast tests: unit bag-of-words vectors."""
    vocab: dict[str, int] = {}
    rows = [[vocab.setdefault(w, len(vocab)) for w in t.lower().strip("?.").split()] for t in texts]
    out = np.zeros((len(texts), max(len(vocab), 1)))
    for i, row in enumerate(rows):
        out[i, row] = 1.0
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def _polluted(n_task: int = 30) -> list[PurityQuestion]:
    qs = [PurityQuestion(i + 1, POOL_PHRASING[i % 3]) for i in range(n_task)]
    return qs + [PurityQuestion(n_task + 1 + i, q) for i, q in enumerate(GENERAL_VQA)]


def test_question_core_drops_options_and_instructions() -> None:
    q = "<image>\nWhat is it?\nOptions:\nA. cat\nB. dog\nAnswer with the option's letter."
    assert question_core(q) == "What is it?"


def test_clean_family_in_its_own_phrasing_is_on_task() -> None:
    qs = [PurityQuestion(i, POOL_PHRASING[0]) for i in range(1, 41)]
    got = measure_purity("Cheques", "alnum", qs, threshold=0.05, min_items=20, embed=None)
    assert (got.off_task, got.share, got.dropped_lines) == (0, 0.0, [])
    assert got.by_rule == {"dominant_form": 40}


def test_polluted_family_over_threshold_drops_the_minority() -> None:
    got = measure_purity(
        "Words", "alnum", _polluted(), threshold=0.05, min_items=20, embed=_bag_of_words
    )
    assert got.off_task == 6 and got.exceeded
    assert got.dropped_lines == list(range(31, 37))
    assert got.summary()["kept"] == 30 and got.summary()["share"] == pytest.approx(6 / 36, 1e-3)


def test_under_threshold_measures_and_keeps() -> None:
    got = measure_purity(
        "Words", "alnum", _polluted(), threshold=0.5, min_items=20, embed=_bag_of_words
    )
    assert got.off_task == 6 and not got.exceeded and got.dropped_lines == []


def test_small_family_is_measured_not_cut() -> None:
    got = measure_purity(
        "Words", "alnum", _polluted(4), threshold=0.05, min_items=20, embed=_bag_of_words
    )
    assert got.dropped_lines == [] and got.by_rule == {"unsettled": 7, "template_off": 3}


def test_multiple_choice_with_options_is_on_task() -> None:
    qs = [
        PurityQuestion(1, "What colour is it?\nA. red\nB. blue", has_options=True),
        PurityQuestion(2, "Describe the image."),
    ]
    got = measure_purity("MMBench", "mc", qs, threshold=0.05, min_items=1, embed=None)
    assert got.rule_of_line == {1: "template_on", 2: "unsettled"}


def _line(i: int, **kw: object) -> dict[str, object]:
    sha = hashlib.sha256(str(kw.get("image", "a.png")).encode()).hexdigest()
    rec = {
        "id": f"x{i}",
        "family": "SynthWords",
        "image": "a.png",
        "question": "Read the word.",
        "answer": "a",
        "source": {"sha256": sha},
    }
    return (
        rec
        | kw
        | {"source": {"sha256": hashlib.sha256(str((rec | kw)["image"]).encode()).hexdigest()}}
    )


def test_ingest_duplicates_symlinks_and_report() -> None:
    recs = [
        _line(1),
        _line(2),
        _line(3, question="Read the word!"),
        _line(4, image="b.png"),
        _line(5, image="link.png"),
        _line(6, family="MMBench", question="Which? (a) cat (b) dog", answer="dog"),
        _line(7, image="huge.png"),
    ]
    data = "\n".join(json.dumps(r) for r in recs).encode() + b"\n{broken\n"
    got = ingest_pool(
        data,
        image_sha256=lambda p: hashlib.sha256(p.encode()).hexdigest(),
        refused={
            "link.png": "symbolic link to a file outside the pool folder",
            "huge.png": {"reason": "image_too_large", "detail": "9 bytes > 8 (not uploaded)"},
        },
        shard_size=2,
        purity_threshold=0.05,
        purity_min_items=20,
    )
    assert got.verdicts == {
        2: ("duplicate_item", "same image and question as line 1"),
        5: ("image_symlink", "link.png: symbolic link to a file outside the pool folder"),
        7: ("image_too_large", "huge.png: 9 bytes > 8 (not uploaded)"),
    }
    fams = got.report["families"]
    assert fams["SynthWords"]["duplicate_items"] == 1
    assert fams["MMBench"]["mcq"] == {"normalised": 1}
    assert fams["SynthWords"]["purity"]["items"] == 3
    text = "\n".join(render_cleaning(got.report))
    assert "| SynthWords | 3 | 0 | 0.0% |" in text and "| MMBench | 1 | 0 | 0 | 0 |" in text
    assert json.loads(json.dumps(got.report)) == got.report
    # every line reaches the clean stage, in shards of 2; a refused file has no pack entry
    assert [len(s.lines) for s in got.inputs] == [2, 2, 2, 2]
    by_line = {pl.line: pl for s in got.inputs for pl in s.lines}
    assert by_line[5].image is None and by_line[1].image is not None


def _nonsense_family(n: int, seed: int) -> list[PurityQuestion]:
    """Questions of 5 words drawn from 30 nonsense words: no template, no single question,
    no dominant form, so every one is open and the dense core stands for the task."""
    rng = np.random.default_rng(seed)
    words = [f"zo{a}{b}" for a in "bcdfg" for b in "klmnpq"]
    return [PurityQuestion(i + 1, " ".join(rng.choice(words, size=5)) + "?") for i in range(n)]


def test_the_dense_core_is_the_mean_similarity_to_every_open_question() -> None:
    """Rule 5 without on-task exemplars: the open questions most similar on average to the
    rest. Checked against the N x N similarity matrix it used to build."""
    qs = _nonsense_family(300, seed=5)
    got = measure_purity("Nonsense", "anls", qs, threshold=0.5, min_items=1, embed=_bag_of_words)
    cores = {q.line: question_core(q.question) for q in qs}
    texts = sorted(set(cores.values()))
    off_texts = [*purity.GENERAL_VQA_PROTOTYPES]
    vecs = _bag_of_words([*texts, *off_texts])
    open_v, off_v = vecs[: len(texts)], vecs[len(texts) :]
    density = (open_v @ open_v.T).mean(axis=1)
    on_v = open_v[np.argsort(-density, kind="stable")[: max(1, len(texts) // 4)]]
    on, off = (open_v @ on_v.T).max(axis=1), (open_v @ off_v.T).max(axis=1)
    verdict = {
        t: "embedding_off" if b > a else "embedding_on"
        for t, a, b in zip(texts, on, off, strict=True)
    }
    assert got.rule_of_line == {ln: verdict[c] for ln, c in cores.items()}
    assert set(got.by_rule) <= {"embedding_on", "embedding_off"}


def test_the_dense_core_of_a_large_family_holds_no_square_matrix() -> None:
    import tracemalloc

    qs = _nonsense_family(6000, seed=6)  # a 6,000 x 6,000 float64 matrix is 288 MB
    tracemalloc.start()
    try:
        measure_purity("Nonsense", "anls", qs, threshold=0.5, min_items=1, embed=_bag_of_words)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 * 1024
