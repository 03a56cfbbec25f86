"""The mirror's audit totals after its source topic was made again (deleted and created, or a
source installation's store lost and started empty): the copies of the old topic stay in the
destination, and so do their counts."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Any

import pytest

from audit.ledger import AuditLedger
from log_store import open_store
from tests.conftest import REPO, logbroker_cmd
from tests.delivery.test_mirror import _seqnos, _topics


def mirror_once(src: str, dst: str) -> None:
    """One mirror run that copies what there is and exits (publishing its counts)."""
    done = subprocess.run(
        logbroker_cmd("mirror", "--from", src, "--to", dst, "--prefix", "dc1.", "--idle-exit", "1"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def mirror_lines(data_dir: Path) -> int:
    """The mirror tier's lines of dc1.app over all windows, as the destination's audit says."""
    ledger = AuditLedger()
    with contextlib.closing(open_store(data_dir, read_only=True)) as store:
        ledger.refresh(store)
    return sum(
        tiers["mirror@dc2"].lines
        for (topic, _), tiers in ledger.series.items()
        if topic == "dc1.app" and "mirror@dc2" in tiers
    )


@pytest.mark.fault
def test_copies_of_a_source_topic_made_again_keep_their_audit_counts(
    start_gateway: Any, writer_for: Any, tmp_path: Path
) -> None:
    dc1 = start_gateway(tmp_path / "dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "dc2", "--dc", "dc2")
    _topics(dc1.data_dir, "create", "dc1.app", "--partitions", "1")
    writer = writer_for(dc1.url)
    writer.write("old", list(range(1, 11)))
    mirror_once(dc1.url, dc2.url)
    assert mirror_lines(dc2.data_dir) == 10
    _topics(dc1.data_dir, "delete", "dc1.app")
    _topics(dc1.data_dir, "create", "dc1.app", "--partitions", "1")
    writer.write("new", [1, 2])
    mirror_once(dc1.url, dc2.url)  # a new process: it knows only the new topic id
    assert len(_seqnos(dc2.url, "dc1.app")) == 12
    # the destination holds 10 + 2 copied lines; a total of the new topic alone (2) would
    # replace the 10 and show them lost
    assert mirror_lines(dc2.data_dir) == 12
