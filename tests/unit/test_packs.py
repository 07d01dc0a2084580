"""Image packs: what upload_pool and ingest write, and how a stage plans its reads."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from rsieve.run.packs import PackWriter, plan_reads, slice_read
from rsieve.schemas import ImageRef


def _build(images: list[bytes], max_bytes: int) -> tuple[PackWriter, dict[str, bytes]]:
    writer, packs = PackWriter("pools/p/", max_bytes=max_bytes), {}
    for n, data in enumerate(images):
        if done := writer.add(f"{n}.png", data):
            packs[done[0]] = done[1]
    if done := writer.flush():
        packs[done[0]] = done[1]
    return writer, packs


@given(
    st.lists(st.binary(min_size=0, max_size=300), max_size=40),
    st.integers(1, 900),
    st.integers(0, 500),
    st.integers(1, 2000),
)
def test_every_image_comes_back_from_its_reads(
    images: list[bytes], max_bytes: int, gap: int, span: int
) -> None:
    writer, packs = _build(images, max_bytes)
    refs = list(writer.index.images.values())
    got: dict[str, bytes] = {}
    for read in plan_reads(refs, max_gap=gap, max_span=span):
        got.update(slice_read(read, packs[read.pack][read.start : read.end]))
        assert read.end - read.start <= max(span, max(r.length for r in read.refs))
    for n, data in enumerate(images):
        ref = writer.index.images[f"{n}.png"]
        assert ref.sha256 == hashlib.sha256(data).hexdigest()
        assert got[ref.sha256] == data


def test_identical_bytes_are_stored_once_and_packs_close_at_the_bound() -> None:
    writer, packs = _build([b"a" * 60, b"b" * 60, b"a" * 60, b"c" * 10], max_bytes=100)
    index = writer.index.images
    assert index["0.png"] == index["2.png"]
    assert sorted(packs) == ["pools/p/_packs/00000.pack", "pools/p/_packs/00001.pack"]
    assert packs["pools/p/_packs/00000.pack"] == b"a" * 60 + b"b" * 60
    assert index["3.png"].pack.endswith("00001.pack") and index["3.png"].offset == 0


def test_neighbours_share_a_read_and_far_ones_do_not() -> None:
    refs = [ImageRef(pack="k", offset=o, length=10, sha256=str(o)) for o in (0, 10, 25, 5000)]
    reads = plan_reads(refs, max_gap=100, max_span=1000)
    assert [(r.start, r.end, len(r.refs)) for r in reads] == [(0, 35, 3), (5000, 5010, 1)]
    other = ImageRef(pack="j", offset=12, length=3, sha256="j")
    assert [r.pack for r in plan_reads([*refs, other], max_gap=100)] == ["j", "k", "k"]


def test_a_short_pack_yields_only_what_it_holds() -> None:
    refs = [
        ImageRef(pack="k", offset=0, length=4, sha256="a"),
        ImageRef(pack="k", offset=4, length=4, sha256="b"),
    ]
    (read,) = plan_reads(refs)
    assert dict(slice_read(read, b"12345")) == {"a": b"1234"}
