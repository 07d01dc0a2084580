"""How the model client cuts a call's requests into Triton requests."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rsieve.adapters.model import ModelRequest
from rsieve.adapters.triton_wire import chunks


def test_chunks_keep_images_apart_and_bounded() -> None:
    reqs = [
        ModelRequest("a", b"i"),
        ModelRequest("b"),
        ModelRequest("c", b"i"),
        ModelRequest("d", b"i"),
        ModelRequest("e"),
    ]
    assert chunks(reqs, 2) == [[0, 2], [3], [1, 4]]


@given(st.lists(st.booleans(), max_size=60), st.integers(1, 17))
def test_every_request_in_exactly_one_chunk(images: list[bool], size: int) -> None:
    reqs = [ModelRequest(str(i), b"x" if has else None) for i, has in enumerate(images)]
    cut = chunks(reqs, size)
    assert sorted(i for c in cut for i in c) == list(range(len(reqs)))
    for chunk in cut:
        assert 1 <= len(chunk) <= size
        assert len({reqs[i].image is None for i in chunk}) == 1
