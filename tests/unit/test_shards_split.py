"""Cutting a pool file into shards of lines."""

from __future__ import annotations

import json

import pytest

from rsieve.run.shards import PoolLine, split_pool


def _rec(item_id: str) -> bytes:
    return json.dumps(
        {"id": item_id, "family": "F", "image": "a.png", "question": "q", "answer": "a"}
    ).encode()


def _flat(shards: list[list[PoolLine]]) -> list[PoolLine]:
    return [line for shard in shards for line in shard]


@pytest.mark.parametrize(
    ("n", "size", "sizes"), [(10, 3, [3, 3, 3, 1]), (9, 3, [3, 3, 3]), (2, 5, [2]), (4, 1, [1] * 4)]
)
def test_shard_sizes(n: int, size: int, sizes: list[int]) -> None:
    data = b"\n".join(_rec(f"id-{i}") for i in range(n)) + b"\n"
    shards, blank = split_pool(data, size)
    assert [len(s) for s in shards] == sizes
    assert len(blank) == 0
    assert [p.line for p in _flat(shards)] == list(range(1, n + 1))


def test_lines_keep_their_text_and_order() -> None:
    recs = [_rec(f"id-{i}") for i in range(5)]
    shards, _ = split_pool(b"\n".join(recs), 2)
    flat = _flat(shards)
    assert [p.raw.encode() for p in flat] == recs
    assert all(p.utf8 and p.duplicate_of is None for p in flat)


def test_line_numbers_survive_blank_lines() -> None:
    data = b"\n".join([_rec("a"), b"", b"   ", _rec("b"), b"\t", _rec("c"), b""]) + b"\n"
    shards, blank = split_pool(data, 2)
    assert [[p.line for p in s] for s in shards] == [[1, 4], [6]]
    assert len(blank) == 4  # lines 2, 3, 5 and 7; the final newline terminates line 7


def test_blank_count_with_and_without_trailing_newline() -> None:
    body = b"\n".join([_rec("a"), b"", _rec("b")])
    assert split_pool(body, 10)[1] == [2]
    assert split_pool(body + b"\n", 10)[1] == [2]
    assert split_pool(body + b"\n\n", 10)[1] == [2, 4]
    assert split_pool(b"\n", 10) == ([], [1])
    assert split_pool(b"\n\n\n", 10) == ([], [1, 2, 3])


def test_crlf_lines() -> None:
    data = _rec("a") + b"\r\n\r\n" + _rec("b") + b"\r\n"
    shards, blank = split_pool(data, 10)
    flat = _flat(shards)
    assert [p.line for p in flat] == [1, 3]
    assert len(blank) == 1
    assert [json.loads(p.raw)["id"] for p in flat] == ["a", "b"]


def test_empty_pool_has_no_blank_lines() -> None:
    assert split_pool(b"", 10) == ([], [])


def test_invalid_utf8_lines_are_kept_flagged() -> None:
    bad = b'{"id": "a", "question": "caf\xe9"}'
    shards, blank = split_pool(_rec("x") + b"\n" + bad + b"\n" + _rec("y"), 10)
    flat = _flat(shards)
    assert [(p.line, p.utf8) for p in flat] == [(1, True), (2, False), (3, True)]
    assert len(blank) == 0
    assert "\\xe9" in flat[1].raw  # escaped, so it survives JSON
    assert flat[1].duplicate_of is None
    PoolLine.model_validate_json(flat[1].model_dump_json())


def test_invalid_utf8_line_with_a_seen_id_is_not_a_duplicate() -> None:
    bad = b'{"id": "x", "q": "\xff"}'
    flat = _flat(split_pool(_rec("x") + b"\n" + bad, 10)[0])
    assert [(p.utf8, p.duplicate_of) for p in flat] == [(True, None), (False, None)]


def test_duplicate_ids_point_at_the_first_line() -> None:
    data = b"\n".join([_rec("a"), _rec("b"), b"", _rec("a"), _rec("c"), _rec("a"), _rec("b")])
    shards, _ = split_pool(data, 2)  # duplicates cross shard boundaries
    flat = _flat(shards)
    assert [(p.line, p.duplicate_of) for p in flat] == [
        (1, None),
        (2, None),
        (4, 1),
        (5, None),
        (6, 1),
        (7, 2),
    ]


def test_lines_without_a_string_id_are_never_duplicates() -> None:
    data = b"\n".join([b"not json", b"not json", b'{"id": 1}', b'{"id": 1}', b"[1]", b"[1]"])
    flat = _flat(split_pool(data, 10)[0])
    assert len(flat) == 6
    assert all(p.duplicate_of is None for p in flat)
