"""Near-duplicates and evaluation sets (rsieve.clean.decontam), decided at ingest: the rules on
hashes, an evaluation set built from a pool, and the whole path through the services'
logic on fakes (a second run of an overlapping pool, a registered set)."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import fakeredis
import pytest
from PIL import Image, ImageDraw, ImageEnhance

from rsieve.clean.decontam import EvalSet, Screen, answer_key, build_evalset, question_key
from rsieve.hashindex import hash_hex, parse_hash
from rsieve.run.packs import image_phash
from rsieve.settings import Settings
from services.worker import bootstrap
from tests.fakes import MemoryStore, Sent

H = "f0f0f0f0f0f0f0f0"
NEAR = hash_hex(parse_hash(H) ^ 0b111)  # 3 bits away
FAR = hash_hex(parse_hash(H) ^ (2**40 - 1))  # 40 bits away


def test_question_key_folds_case_and_spacing() -> None:
    assert question_key("What  word is SHOWN?") == question_key("what word is shown?")
    assert question_key("What word?") != question_key("Which word?")


def test_a_near_duplicate_with_the_same_question_is_a_duplicate_item() -> None:
    screen = Screen(distance=4)
    assert screen.check(1, H, "What word?", ["x"]) is None
    reason, detail = screen.check(2, NEAR, "what  WORD?", ["x"]) or ("", "")
    assert reason == "duplicate_item" and "3 bits of line 1" in detail
    assert screen.check(3, NEAR, "Another question?", ["x"]) is None  # same image, other question
    # Same question, another answer: two different words on look-alike crops, both kept.
    assert screen.check(6, NEAR, "What word?", ["y"]) is None
    assert screen.check(4, FAR, "What word?", ["x"]) is None
    assert Screen(distance=2).check(1, H, "q", ["x"]) is None
    assert screen.check(5, None, "What word?", ["x"]) is None  # no hash: nothing to compare


def test_what_an_earlier_run_committed_is_already_in_the_dataset() -> None:
    screen = Screen(
        distance=4, committed={"ds-aaa": [(H, question_key("What word?"), answer_key(["X"]), ())]}
    )
    reason, detail = screen.check(1, NEAR, "What word?", ["x"]) or ("", "")
    assert reason == "duplicate_item" and "already in the dataset" in detail and "ds-aaa" in detail
    assert screen.check(2, NEAR, "Other?", ["x"]) is None


def test_an_evaluation_set_image_makes_an_item_contaminated() -> None:
    es = EvalSet("iiit5k-test", [(H, question_key("What word?"))])
    screen = Screen(distance=4, evalsets={"iiit5k-test": es})
    reason, detail = screen.check(1, NEAR, "Any question at all?", ["x"]) or ("", "")
    assert reason == "contaminated" and "iiit5k-test" in detail
    assert screen.check(2, FAR, "What word?", ["x"]) is None
    strict = Screen(distance=4, evalsets={"iiit5k-test": es}, match="image_and_question")
    assert strict.check(1, NEAR, "Any question at all?", ["x"]) is None
    assert (strict.check(2, NEAR, "what word?", ["x"]) or ("",))[0] == "contaminated"
    assert screen.summary()["evalsets"] == {"iiit5k-test": 1}
    with pytest.raises(ValueError):
        Screen(distance=17)


def _sign(text: str, size: tuple[int, int] = (200, 80)) -> Image.Image:
    """A picture of its own per text: blocks placed and coloured from the text's seed."""
    import random

    rng = random.Random(text)
    img = Image.new("RGB", size, (230, 220, 200))
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        x, y = rng.randrange(size[0] - 40), rng.randrange(size[1] - 20)
        fill = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        draw.rectangle((x, y, x + rng.randrange(20, 60), y + rng.randrange(10, 40)), fill=fill)
    draw.text((30, 30), text, fill=(20, 20, 20))
    return img


def _bytes(img: Image.Image, fmt: str = "PNG", **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def test_a_re_encoded_resized_brightened_copy_keeps_a_near_hash() -> None:
    original = _sign("EXIT")
    h = parse_hash(image_phash(_bytes(original)) or "")
    copies = [
        _bytes(original.convert("RGB"), "JPEG", quality=75),
        _bytes(original.resize((300, 120))),
        _bytes(ImageEnhance.Brightness(original).enhance(1.1)),
    ]
    for data in copies:
        assert (h ^ parse_hash(image_phash(data) or "")).bit_count() <= 10


def test_build_evalset_hashes_each_line_and_counts_what_it_left_out() -> None:
    data = _bytes(_sign("STOP"))
    items = (
        b"\n".join(
            json.dumps(r).encode()
            for r in [
                {"id": "1", "image": "a.png", "question": "What word?"},
                {"id": "2", "image": "missing.png", "question": "What word?"},
                {"id": "3", "image": "junk.png", "question": "What word?"},
            ]
        )
        + b"\n{broken\n"
    )
    found = {"a.png": data, "junk.png": b"not an image"}
    es, figures = build_evalset("test-set", items, found.get)
    assert figures == {"lines": 4, "hashed": 1, "left_out": 3}
    assert (image_phash(data), question_key("What word?")) in es.items
    assert 2 <= len(es.items) <= 11  # the image and its crops (rsieve.hashindex.REFERENCE_CROPS)
    assert EvalSet.from_json(es.to_json()) == es
    with pytest.raises(ValueError):
        build_evalset("../escape", items, found.get)


def _pool(folder: Path, images: dict[str, bytes], question: str = "What word?") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for n, (name, data) in enumerate(sorted(images.items())):
        (folder / name).write_bytes(data)
        lines.append(
            json.dumps(
                {
                    "id": f"{folder.name}-{n}",
                    "family": "SynthWords",
                    "image": name,
                    "question": question,
                    "answer": "x",
                    "source": {"dataset": "signs"},
                }
            )
        )
    (folder / "items.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_ingest_screens_against_evaluation_sets_and_the_dataset(tmp_path: Path) -> None:
    """Through the services' logic on fakes: a registered set quarantines the copies of its
    images `contaminated`; a second run whose pool overlaps the first (cut, resized and
    re-encoded copies) quarantines the overlap `duplicate_item` at ingest, before any model
    call."""
    from rsieve.adapters.pools import upload_pool
    from rsieve.clean.decontam import dataset_keys, evalset_key, near_keys_key
    from services.api.submission import submit
    from services.cleaner.tasks import register as clean_tasks

    store, sent = MemoryStore(), Sent()
    ctx = bootstrap(
        Settings(purity_embedding=False),
        store=store,
        redis_client=fakeredis.FakeRedis(),
        send=sent,
    )
    clean_tasks(ctx)
    words = ["OPEN", "EXIT", "STOP", "SALE", "PUSH", "PULL"]
    originals = {f"{w.lower()}.png": _bytes(_sign(w)) for w in words}
    # Cut 5% off the left and top, resized, re-encoded: STOP's hash moves 20 bits; its
    # crops' hashes (the pack index's crop_phashes, the committed keys') find it.
    copies = {
        f"copy-{w.lower()}.jpg": _bytes(
            _sign(w).crop((10, 4, 200, 80)).resize((260, 104)), "JPEG", quality=80
        )
        for w in words
    }

    def quarantined(run: str) -> dict[str, str]:
        ctx.app.tasks["rsieve.ingest"](run=run)
        out: dict[str, str] = {}
        for task, kw in list(sent.tasks):
            if task == "rsieve.clean" and kw["run"] == run:
                for pl in json.loads(store.get(f"runs/{run}/input/{kw['shard']}.json"))["lines"]:
                    if pl.get("verdict"):
                        out[json.loads(pl["raw"])["id"]] = pl["verdict"][0]
        return out

    # No set registered: nothing is contaminated.
    first_uri = upload_pool(store, _pool(tmp_path / "first", originals))
    first_pool = first_uri.rstrip("/").rsplit("/", 1)[1]
    first = submit(ctx, first_uri, "signs")
    assert quarantined(first) == {}

    # The first run's items committed to the dataset: the pairs the compactor writes.
    index = json.loads(store.get(f"pools/{first_pool}/_packs/index.json"))
    assert all(ref["phash"] for ref in index["images"].values())
    pairs = [
        (ref["phash"], question_key("What word?"), answer_key(["x"]), ref["crop_phashes"])
        for ref in index["images"].values()
    ]
    store.put(near_keys_key("signs", first), dataset_keys(pairs))
    second = submit(ctx, upload_pool(store, _pool(tmp_path / "second", copies)), "signs")
    assert set(quarantined(second).values()) == {"duplicate_item"}
    assert len(quarantined(second)) == len(words)

    # A registered evaluation set of the originals: the copies are contaminated, in any
    # dataset, and registering it makes a new run of the same pool and dataset.
    second_uri = upload_pool(store, tmp_path / "second")
    before = submit(ctx, second_uri, "other-dataset")
    es, _ = build_evalset(
        "signs-test", (tmp_path / "first" / "items.jsonl").read_bytes(), originals.get
    )
    store.put(evalset_key("signs-test"), es.to_json())
    third = submit(ctx, second_uri, "other-dataset")
    assert third != before
    assert set(quarantined(third).values()) == {"contaminated"}
    cleaning = json.loads(store.get(f"runs/{third}/cleaning.json"))
    assert cleaning["screen"]["evalsets"] == {"signs-test": len(words)}
    from rsieve.clean.cleaning import render_cleaning

    card = "\n".join(render_cleaning(cleaning))
    assert "| signs-test | 6 |" in card and "`contaminated`" in card


def test_the_compactor_lists_each_added_items_image_hash_and_question() -> None:
    from rsieve.dataset.commit import near_keys
    from rsieve.schemas import ImageRef
    from tests.unit._records import accepted, make_item

    item = make_item(question="What word?")
    ref = ImageRef(pack="p", offset=0, length=1, sha256="a" * 64, phash=H)
    with_ref = item.model_copy(update={"image_at": ref, "pool_question": "What  WORD?"})
    without = make_item("other", image="img-b")
    assert json.loads(near_keys([accepted(with_ref), accepted(without)])) == [
        [H, question_key("what word?"), answer_key(["coffee"]), []]
    ]


@pytest.mark.parametrize("seed", range(4))
def test_grouped_screen_answers_as_one_index_over_every_image(seed: int) -> None:
    """The screen compares an image only with those seen with the same question and answer
    (a loop, or a HashIndex past GROUP_INDEXED_FROM): the verdict and its detail are what
    one HashIndex over every image answered first (least distance, then earliest added)."""
    import random

    from rsieve.clean.decontam import GROUP_INDEXED_FROM
    from rsieve.hashindex import HashIndex, hash_hex

    rng = random.Random(seed)
    base = [rng.getrandbits(64) for _ in range(40)]

    def near_hash() -> int:
        h = rng.choice(base)
        for _ in range(rng.randrange(0, 8)):
            h ^= 1 << rng.randrange(64)
        return h

    keys = [(f"q{rng.randrange(2)}", f"a{rng.randrange(2)}") for _ in range(1000)]
    committed = [(hash_hex(near_hash()), q, a, ()) for q, a in keys[:40]]
    screen = Screen(distance=4, committed={"r1": committed})
    reference = HashIndex(max_radius=16)
    for hex_, q, a, _ in sorted(committed):
        reference.add(parse_hash(hex_), f"{q}\t{a}\trun r1")
    groups: Counter[tuple[str, str]] = Counter()
    for line, (q, a) in enumerate(keys[40:], start=1):
        h = near_hash()
        got = screen.check_keys(line, hash_hex(h), q, a)
        hit = next(
            (
                (key.split("\t", 2)[2], d)
                for key, d in reference.near(h, 4)
                if key.split("\t", 2)[:2] == [q, a]
            ),
            None,
        )
        assert (got is None) == (hit is None)
        if got is None:
            reference.add(h, f"{q}\t{a}\tline {line}")
            groups[(q, a)] += 1
        else:
            assert hit is not None and f"within {hit[1]} bits of" in got[1]
            assert (hit[0] in got[1]) or hit[0].startswith("line ")
            if hit[0].startswith("line "):
                assert got[1].endswith(f"{hit[0]}'s")
    assert max(groups.values()) >= GROUP_INDEXED_FROM  # both kinds of group were searched


def test_an_image_is_kept_under_its_crops_both_ways_but_never_crop_against_crop() -> None:
    """An earlier image A (hash H, one crop hash C): a later line whose hash lies near C was
    cut from A; a later line with a crop hash near H is an image A was cut from; a later
    line whose crops lie near C alone is neither (crop against crop would double the
    chances of a false match for no copy the bench makes)."""
    h, c = parse_hash(H), parse_hash(FAR)
    near_c = hash_hex(c ^ 0b11)
    screen = Screen(distance=4)
    assert screen.check(1, H, "What word?", ["x"], crops=[FAR]) is None
    found = screen.check(2, near_c, "What word?", ["x"])
    assert found is not None and "within 2 bits of line 1's" in found[1], found
    other = hash_hex(h ^ (2**30 - 1))
    found = screen.check(3, other, "What word?", ["x"], crops=[NEAR])
    assert found is not None and "within 3 bits of line 1's" in found[1], found
    lone = hash_hex(c ^ (2**50 - 1 << 8))
    assert screen.check(4, lone, "What word?", ["x"], crops=[near_c]) is None
    assert screen.check(5, near_c, "Other?", ["x"]) is None  # another question


def test_a_cut_copy_is_a_duplicate_in_the_pool_and_of_what_the_dataset_holds() -> None:
    """Real pictures cut 5% off the left and top, resized and re-encoded: 20 bits from the
    original for STOP, so its own hash alone misses it; its crops find it either way round,
    and a committed run's keys (keys/<run>.near.json as the compactor writes it) carry
    them to the next run."""
    from rsieve.clean.decontam import dataset_keys, read_dataset_keys
    from rsieve.run.packs import image_phashes

    img = _sign("STOP")
    w, h = img.size
    original = image_phashes(_bytes(img))
    cut = image_phashes(_bytes(img.crop((10, 4, w, h)).resize((260, 104)), "JPEG", quality=80))
    other = image_phashes(_bytes(_sign("PUSH")))
    assert original[0] and cut[0] and other[0]
    assert (parse_hash(original[0]) ^ parse_hash(cut[0])).bit_count() > 8
    assert Screen(distance=8).check(1, original[0], "q", "a") is None
    for first, then in ((original, cut), (cut, original)):
        screen = Screen(distance=8)
        assert screen.check(1, first[0], "q", "a", first[1]) is None
        assert screen.check(2, other[0], "q", "a", other[1]) is None  # another picture
        found = screen.check(3, then[0], "q", "a", then[1])
        assert found is not None and "of line 1's" in found[1], found
        # Without the crops, the old way: a miss.
        assert Screen(distance=8).check(1, first[0], "q", "a") is None
    keys = read_dataset_keys(
        dataset_keys([(original[0], question_key("q"), answer_key("a"), original[1])])
    )
    assert keys == [(original[0], question_key("q"), answer_key("a"), original[1])]
    screen = Screen(distance=8, committed={"r1": keys})
    found = screen.check(1, cut[0], "q", "a", cut[1])
    assert found is not None and "that run r1 committed" in found[1], found


def test_near_keys_written_before_crop_hashes_read_as_the_image_alone() -> None:
    from rsieve.clean.decontam import read_dataset_keys

    old = json.dumps([[H, "q" * 16, "a" * 16]]).encode()
    assert read_dataset_keys(old) == [(H, "q" * 16, "a" * 16, ())]
    screen = Screen(distance=4, committed={"old": read_dataset_keys(old)})
    assert screen.check_keys(1, NEAR, "q" * 16, "a" * 16) is not None


@pytest.mark.parametrize("seed", range(3))
def test_grouped_screen_with_crops_answers_as_a_scan_of_every_image(seed: int) -> None:
    """With crop hashes, small groups (a loop) and large ones (two HashIndexes past
    GROUP_INDEXED_FROM) answer as a scan of every earlier image of the same question and
    answer: the least distance of (line's hash, image's hashes) and (line's crops, image's
    own hash), then the earliest image."""
    import random

    from rsieve.clean.decontam import GROUP_INDEXED_FROM

    rng = random.Random(seed)
    base = [rng.getrandbits(64) for _ in range(30)]

    def near(h: int, bits: int) -> int:
        for _ in range(rng.randrange(bits)):
            h ^= 1 << rng.randrange(64)
        return h

    def image() -> tuple[int, list[int]]:
        h = near(rng.choice(base), 10)
        return h, [near(rng.choice(base), 10) for _ in range(rng.randrange(4))]

    screen = Screen(distance=4)
    seen: dict[str, list[tuple[int, list[int], int]]] = {}
    sizes: Counter[str] = Counter()
    for line in range(1, 1500):
        q = f"q{rng.randrange(3)}"
        h, crops = image()
        got = screen.check_keys(line, hash_hex(h), q, "a", [hash_hex(c) for c in crops])
        dists = [
            (
                min([(h ^ k).bit_count() for k in (p, *kc)] + [(c ^ p).bit_count() for c in crops]),
                at,
            )
            for p, kc, at in seen.get(q, [])
        ]
        best = min(((d, at) for d, at in dists if d <= 4), default=None)
        if best is None:
            assert got is None
            seen.setdefault(q, []).append((h, crops, line))
            sizes[q] += 1
        else:
            assert got is not None and got[1].endswith(f"within {best[0]} bits of line {best[1]}'s")
    assert max(sizes.values()) >= GROUP_INDEXED_FROM
