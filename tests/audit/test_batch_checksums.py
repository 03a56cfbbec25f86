"""``logbroker audit`` checks every batch's checksum, the batches that carry only state too."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from log_store import PartitionState, TopicConfig, open_store
from log_store.record_batch import HEADER_SIZE
from session_dedup.seqno_table import encode_seqno, seqno_key
from tests.ops.test_audit_and_topics_cli import chunk, logbroker


def write_state_then_records(data_dir: Path) -> Path:
    """A partition whose segment starts with a state-only batch (as a fencing session open
    writes), then holds a record batch and another state-only batch; its segment file."""
    with open_store(data_dir) as store:
        store.create_topic("dc1.early", TopicConfig(partitions=1))
        store.transact("dc1.early", 0, lambda s: (s.put("epoch/src-a", b"\x01" * 8), [])[1])

        def admit(state: PartitionState) -> Sequence[bytes]:
            state.put(seqno_key("src-a"), encode_seqno(30))
            return [chunk("src-a", s) for s in (10, 20, 30)]

        store.transact("dc1.early", 0, admit)
        store.transact("dc1.early", 0, lambda s: (s.put("epoch/src-a", b"\x02" * 8), [])[1])
    (segment,) = (data_dir / "topics" / "dc1.early").glob("*/0/00000000000000000000.log")
    return segment


def flip(path: Path, pos: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0x5A]))


def test_audit_reports_a_damaged_batch_that_carries_only_state(tmp_path: Path) -> None:
    segment = write_state_then_records(tmp_path)
    assert "audit: OK" in logbroker("audit", "--data-dir", str(tmp_path)).stdout
    flip(segment, HEADER_SIZE + 25)  # inside the first batch's state section
    result = logbroker("audit", "--data-dir", str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "dc1.early/0: segment 0 byte 0: batch of offset 0 (state only) fails its checksum"
        in result.stdout
    )
    assert "audit: 1 problem(s)" in result.stdout


def test_audit_goes_on_past_a_damaged_batch_to_the_next_one(tmp_path: Path) -> None:
    segment = write_state_then_records(tmp_path)
    size = segment.stat().st_size
    flip(segment, HEADER_SIZE + 25)
    flip(segment, size - 3)  # the last state-only batch's value
    result = logbroker("audit", "--data-dir", str(tmp_path))
    assert result.returncode == 1
    lines = [line for line in result.stdout.splitlines() if "fails its checksum" in line]
    assert len(lines) == 2, result.stdout
    assert "batch of offset 3 (state only)" in lines[1]


def test_audit_reports_a_damaged_header_and_the_batches_after_it(tmp_path: Path) -> None:
    segment = write_state_then_records(tmp_path)
    flip(segment, 10)  # the first batch's base offset: where it is, is no longer known
    result = logbroker("audit", "--data-dir", str(tmp_path))
    assert result.returncode == 1
    assert "segment 0 byte 0: batch of offset" in result.stdout
    assert "where 0 was due" in result.stdout


def test_a_damaged_record_batch_is_not_reported_as_a_dedup_table_ahead_of_the_log(
    tmp_path: Path,
) -> None:
    with open_store(tmp_path) as store:
        store.create_topic("dc1.cor", TopicConfig(partitions=1))
        for seqno in (10, 20, 30):

            def admit(state: PartitionState, seqno: int = seqno) -> Sequence[bytes]:
                state.put(seqno_key("c"), encode_seqno(seqno))
                return [chunk("c", seqno)]

            store.transact("dc1.cor", 0, admit)
            if seqno == 10:
                (segment,) = (tmp_path / "topics" / "dc1.cor").glob("*/0/*.log")
                second = segment.stat().st_size  # where the batch of seqno 20 starts
    flip(segment, second + HEADER_SIZE + 30)
    result = logbroker("audit", "--data-dir", str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "dc1.cor/0@1: unreadable:" in result.stdout
    assert "the records from there on and the dedup table are not checked" in result.stdout
    assert "dedup table says" not in result.stdout, result.stdout
