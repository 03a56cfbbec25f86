"""The audit's line count: :func:`newlines` agrees with ``bytes.count`` on every shape of data,
whichever of its two ways the probe picks."""

from __future__ import annotations

import random

import pytest

from session_dedup.chunk_codecs import count_lines, newlines

NEWLINE = b"\n"


def _lines(rng: random.Random, sizes: tuple[int, int], total: int) -> bytes:
    out = bytearray()
    while len(out) < total:
        out += bytes(rng.randrange(32, 127) for _ in range(rng.randint(*sizes))) + b"\n"
    return bytes(out[:total])


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\n",
        b"no newline at all",
        b"\n" * 65_536,  # dense everywhere: counted byte by byte
        b"x" * 65_536,
        (b"x" * 199 + b"\n") * 330,  # access-log lines: counted between newlines
        (b"x" * 9 + b"\n") * 6_554,
        b"x" * 1_024 + b"\n" * 64_512,  # a sparse probe, all newlines after it
        b"\n" * 16 + b"x" * 1_000,  # exactly the dense threshold inside the probe
        b"\n" * 15 + b"x" * 2_000 + b"\n" * 3,
        b"\r\n" * 100,  # only b"\n" counts
    ],
    ids=lambda d: f"{len(d)}B-{d.count(NEWLINE)}nl",
)
def test_it_counts_what_bytes_count_counts(data: bytes) -> None:
    assert newlines(data) == data.count(b"\n")
    assert newlines(memoryview(data)) == data.count(b"\n")


def test_random_lines_of_every_length_and_slices_of_a_body() -> None:
    rng = random.Random(11)
    for sizes in ((0, 3), (10, 60), (50, 300), (500, 5_000)):
        body = _lines(rng, sizes, 200_000)
        view = memoryview(body)
        for _ in range(20):
            start = rng.randrange(len(body))
            stop = rng.randrange(start, len(body) + 1)
            assert newlines(view[start:stop]) == body.count(b"\n", start, stop)


def test_a_raw_chunks_lines_are_its_newlines() -> None:
    assert count_lines("raw", memoryview(b"a\nb\nc\n")[2:]) == 2
