"""The pull client reads a binary answer as it arrives: the same sections as a whole-answer
parse, however the network cuts it, and a cut-short or foreign answer is refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from delivery.framing import (
    BadFraming,
    BinarySection,
    binary_pieces,
    coalesced,
    decode_binary,
    decode_binary_stream,
    encode_binary,
)
from delivery.partition_reader import DeliveredMessage, PartitionBatch
from delivery.pull_client import PullClient, RequestRefused


def _batches() -> list[PartitionBatch]:
    sizes = [0, 1, 17, 70_000, 5, 200_000]
    first = PartitionBatch(
        "dc1.app",
        1,
        0,
        len(sizes),
        len(sizes),
        [DeliveredMessage(i, bytes([i]) * n, None) for i, n in enumerate(sizes)],
    )
    empty = PartitionBatch("dc1.app", 2, 3, 3, 3)
    last = PartitionBatch("dc1.web", 0, 0, 9, 9, [DeliveredMessage(8, b"tail", None)])
    return [first, empty, last]


def _body() -> bytes:
    return encode_binary(_batches())


def _chunks(body: bytes, size: int) -> Iterator[bytes]:
    for at in range(0, len(body), size):
        yield b""  # a network read may come back empty
        yield body[at : at + size]


def _parse(parse: Any, body: Any) -> list[BinarySection] | str:
    try:
        result: list[BinarySection] = parse(body)
        return result
    except BadFraming:
        return "refused"


@pytest.mark.parametrize("size", [1, 3, 11, 4096, 65_536, 10**9])
def test_an_answer_read_in_chunks_gives_the_sections_of_the_whole_answer(size: int) -> None:
    body = _body()
    sections = decode_binary_stream(_chunks(body, size))
    assert sections == decode_binary(body)
    assert [len(v) for _, v in sections[0].records] == [0, 1, 17, 70_000, 5, 200_000]
    assert all(type(v) is bytes for s in sections for _, v in s.records)


@pytest.mark.parametrize("size", [1, 16, 1000, 100_000, 10**9])
def test_a_sent_answer_is_its_pieces_in_order_large_values_not_copied(size: int) -> None:
    pieces = binary_pieces(_batches())
    blocks = list(coalesced(pieces, size))
    assert b"".join(blocks) == _body()
    large = [p for p in pieces if len(p) >= size]
    assert [b for b in blocks if any(b is p for p in large)] == large
    # a block of joined small pieces is short only where a large piece or the end follows
    for i, block in enumerate(blocks[:-1]):
        if not any(block is p for p in large):
            assert len(block) >= size or any(blocks[i + 1] is p for p in large)


def test_an_answer_cut_anywhere_is_refused_unless_it_ends_between_sections() -> None:
    batches = _batches()
    body = encode_binary(batches)
    between = [len(encode_binary(batches[:n])) for n in range(len(batches))]
    cuts = {*range(200), *range(200, len(body), 997), *[b + d for b in between for d in (-1, 1)]}
    parsed = []
    for cut in sorted(cuts | set(between)):
        short = body[:cut]
        streamed = _parse(lambda b: decode_binary_stream(_chunks(b, 4096)), short)
        assert streamed == _parse(decode_binary, short), cut
        if streamed != "refused":
            parsed.append(cut)
    assert parsed == between
    for foreign in (b"", b"LBR", b"LBR2", b"LBR1\x00\x02{]"):
        assert _parse(lambda b: decode_binary_stream(iter([b])), foreign) == "refused"


def test_fetch_returns_values_longer_than_a_network_read_and_refusals_keep_their_body(
    gateway: Any,
) -> None:
    data = "".join(f"line {i:06d} {'x' * 90}\n" for i in range(3000))  # 300 kB in one chunk
    item = {
        "log_type": "big",
        "source_id": "s",
        "seqno": 1,
        "server": "h",
        "file": "/f",
        "codec": "raw",
        "data": data,
    }
    written = httpx.post(
        f"{gateway.url}/v1/write",
        content=json.dumps(item).encode(),
        headers={"content-type": "application/x-ndjson"},
        timeout=30,
    )
    assert written.status_code == 200, written.text
    client = PullClient(gateway.url)
    try:
        parts = client.fetch([("dc1.big", p, 0) for p in range(4)])
        messages = [m for part in parts for m in part.messages]
        assert [m.text_data() for m in messages] == [data.encode()]
        assert bytes(messages[0].text_view()) == data.encode()
        end = next(part for part in parts if part.messages).next_offset
        partition = messages[0].partition
        with pytest.raises(RequestRefused) as refused:
            client.fetch([("dc1.big", partition, end + 5)])
        assert refused.value.status == 416
        assert (refused.value.body["start_offset"], refused.value.body["end_offset"]) == (0, 1)
    finally:
        client.close()
