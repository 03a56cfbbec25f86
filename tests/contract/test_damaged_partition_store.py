"""One damaged partition of the embedded store (it lost acknowledged data) is kept as it is and
left out, while the store goes on with the topic's other partitions."""

from __future__ import annotations

import os
from pathlib import Path

from log_store import TopicConfig, open_store


def test_retention_goes_on_with_the_other_partitions_of_a_damaged_ones_topic(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    config = TopicConfig(partitions=2, segment_bytes=4096, retention_bytes=4096)
    with open_store(data_dir) as store:
        store.create_topic("dc1.t", config)
        for _ in range(12):
            for p in range(2):
                store.append("dc1.t", p, [b"x" * 1000])
    (topic_dir,) = (data_dir / "topics" / "dc1.t").iterdir()
    damaged = sorted((topic_dir / "0").glob("*.log"))
    os.truncate(damaged[-1], damaged[-1].stat().st_size - 5)
    with open_store(data_dir) as store:
        moved = store.apply_retention()
        assert list(moved) == [("dc1.t", 1)] and moved[("dc1.t", 1)] > 0
        assert sorted((topic_dir / "0").glob("*.log")) == damaged  # left for the operator
        (named,) = store.damaged_partitions()
        assert named == ("dc1.t", 0)
