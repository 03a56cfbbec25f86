"""What the audit's hook costs the gateway's write path, next to work the path does anyway.

For a section of chunks (raw, lines of 100 bytes), it times ``count_written`` (the hook run
after the fsync) and, as the peer measured in the same run, encoding the same chunks' envelopes
(``EnvelopeWriter.encoder``, which every written chunk goes through).  Prints medians of
several runs and the ratio; never fails on speed.

    python benchmarks/audit_bench.py [--chunks 1000] [--chunk-bytes 4096] [--runs 7] [--json F]
    python benchmarks/audit_bench.py --forwarded [--chunk-bytes 65536] [--runs 7]
    python benchmarks/audit_bench.py --journal DIR [--chunks 1]

``--forwarded`` times instead what a partition's owner spends counting a forwarded write of
zstd chunks (access-log-like lines of about 200 B): with the line counts the sending gateway
made when it checked the chunks (``record_lines``), against decompressing each chunk (what an
owner does for a sender that sends none).

``--journal DIR`` times the hook a second time with the gateway's journal in DIR attached to
its counts (:mod:`audit.journal`: one append per section), in the same interleaved runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from audit.journal import CountJournal, journal_counts
from audit.windows import WindowCounts
from ingest_api.audit_api import CommittedCounter, count_written
from session_dedup.chunk_codecs import count_lines
from session_dedup.envelope import EnvelopeWriter
from session_dedup.exactly_once import WRITTEN, ChunkBatch


def _run_s(fn: Callable[[], None], repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat


def forwarded(args: argparse.Namespace) -> None:
    import random

    import zstandard

    rng = random.Random(1)
    text = b"".join(
        b"2026-11-26T09:00:%02d host%d GET /api/v1/items/%d HTTP/1.1 200 %d %dms trace=%016x\n"
        % (
            i % 60,
            i % 50,
            rng.randrange(10**6),
            rng.randrange(10**5),
            rng.randrange(999),
            rng.getrandbits(64),
        )
        for i in range(args.chunk_bytes // 80)
    )[: args.chunk_bytes]
    text = text[: text.rindex(b"\n") + 1]
    compress = zstandard.ZstdCompressor().compress
    now_ms = int(time.time() * 1000)
    writer = EnvelopeWriter(source_id="b", server="h", file="/f", log_type="app", codec="zstd")
    chunks = [compress(text + b"%d\n" % i) for i in range(args.chunks)]
    records = [writer.encode(i + 1, now_ms, now_ms, c) for i, c in enumerate(chunks)]
    lines = [count_lines("zstd", c) for c in chunks]
    compressed_mb = sum(len(c) for c in chunks) / 1e6
    counts = WindowCounts()
    count = CommittedCounter(counts)

    def with_lines() -> None:
        count("dc1.app", records, lines)
        counts.snapshot()

    def decompressing() -> None:
        count("dc1.app", records)
        counts.snapshot()  # a compressed chunk's lines are counted here

    given_runs, decompress_runs = [], []
    for _ in range(args.runs):
        given_runs.append(_run_s(with_lines, 3))
        decompress_runs.append(_run_s(decompressing, 3))
    given, decompressed = statistics.median(given_runs), statistics.median(decompress_runs)
    print(
        f"{args.chunks} zstd chunks of {len(text)} B of lines ({compressed_mb:.1f} MB compressed), "
        f"medians of {args.runs} runs"
    )
    print(f"{'owner counts':<34} {'per chunk':>10} {'per MB compressed':>18}")
    for what, t in (("with the sender's line counts", given), ("decompressing", decompressed)):
        print(f"{what:<34} {t * 1e6 / args.chunks:>7.1f} us {t * 1e3 / compressed_mb:>15.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=1000)
    parser.add_argument("--chunk-bytes", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    parser.add_argument("--forwarded", action="store_true", help="see the module's docstring")
    parser.add_argument("--journal", type=Path, help="also time the hook journaling in DIR")
    args = parser.parse_args()
    if args.forwarded:
        return forwarded(args)
    line = b"x" * 99 + b"\n"
    data = line * max(1, args.chunk_bytes // len(line))
    now_ms = int(time.time() * 1000)
    body = memoryview(data * args.chunks)
    datas: list[bytes | memoryview] = [
        body[i * len(data) : (i + 1) * len(data)] for i in range(args.chunks)
    ]
    batch = ChunkBatch(list(range(1, args.chunks + 1)), [now_ms] * args.chunks, datas)
    written = bytearray([WRITTEN]) * args.chunks
    counts = WindowCounts()
    writer = EnvelopeWriter(source_id="bench", server="h", file="/f", log_type="app")

    def hook() -> None:
        count_written(counts, "dc1.app", "raw", batch, written)

    journaled = WindowCounts()
    journal = None
    if args.journal is not None:
        journal = CountJournal(args.journal, f"bench-{time.time_ns()}")
        journal_counts(journaled, journal)

    def journaled_hook() -> None:
        count_written(journaled, "dc1.app", "raw", batch, written)

    def envelopes() -> None:
        encode = writer.encoder(now_ms)
        for seqno, create_time, chunk in zip(batch.seqnos, batch.create_times, datas, strict=True):
            encode(seqno, create_time, chunk)

    repeat = max(1, 200_000 // args.chunks)
    hook_runs, peer_runs, journal_runs = [], [], []
    for _ in range(args.runs):  # interleaved: a slow moment of the machine hits both
        hook_runs.append(_run_s(hook, repeat))
        if journal is not None:
            journal_runs.append(_run_s(journaled_hook, repeat))
        peer_runs.append(_run_s(envelopes, repeat))
    if journal is not None:
        journal.close(remove=True)
    hook_s, peer_s = statistics.median(hook_runs), statistics.median(peer_runs)
    per_chunk = 1e9 / args.chunks
    print(f"{'what':<34} {'per section':>12} {'per chunk':>10}")
    print(
        f"{'audit hook (count_written)':<34} {hook_s * 1e6:>9.1f} us {hook_s * per_chunk:>7.0f} ns"
    )
    if journal_runs:
        with_s = statistics.median(journal_runs)
        print(f"{'same, journaled':<34} {with_s * 1e6:>9.1f} us {with_s * per_chunk:>7.0f} ns")
    print(f"{'envelope encoding (peer)':<34} {peer_s * 1e6:>9.1f} us {peer_s * per_chunk:>7.0f} ns")
    print(
        f"hook / envelope encoding: {hook_s / peer_s:.2f}  ({args.chunks} chunks of "
        f"{len(data)} bytes, medians of {args.runs} runs)"
    )
    if args.json is not None:
        from benchmark_results import Figure, write

        what = f"audit hook per chunk of {len(data)} B"
        figure = Figure.of_runs(what, [t * per_chunk for t in hook_runs], "ns")
        ratios = [h / p for h, p in zip(hook_runs, peer_runs, strict=True)]
        write(args.json, "audit", args, [figure.compared("envelope encoding", ratios)])


if __name__ == "__main__":
    main()
