"""Where Spark JVMs keep their temporary files: a JVM that is SIGKILLed runs no shutdown hook to
delete them, so they must not be in /tmp.  Checked on the settings; nothing is started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from yt_loader.spark_session import _scratch_warehouse
from yt_loader.standalone_cluster import StandaloneCluster


def test_cluster_daemons_and_executors_keep_temporary_files_in_the_work_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPARK_DAEMON_JAVA_OPTS", raising=False)
    cluster = StandaloneCluster(tmp_path / "spark", workers=1)

    env = cluster._daemon_env(cluster.worker_hosts[0])

    assert env["SPARK_DAEMON_JAVA_OPTS"] == f"-Djava.io.tmpdir={tmp_path / 'spark' / 'tmp'}"
    assert cluster.executor_java_options() == f"-Djava.io.tmpdir={tmp_path / 'spark' / 'tmp'}"


def test_cluster_daemons_keep_the_callers_own_java_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_DAEMON_JAVA_OPTS", "-Dx=1")
    assert StandaloneCluster(tmp_path)._daemon_env("127.0.0.2")["SPARK_DAEMON_JAVA_OPTS"] == (
        f"-Dx=1 -Djava.io.tmpdir={tmp_path / 'tmp'}"
    )
    monkeypatch.setenv("SPARK_DAEMON_JAVA_OPTS", "-Djava.io.tmpdir=/scratch")
    assert StandaloneCluster(tmp_path)._daemon_env("127.0.0.2")["SPARK_DAEMON_JAVA_OPTS"] == (
        "-Djava.io.tmpdir=/scratch"
    )


def test_the_spark_drivers_the_tests_start_keep_temporary_files_in_the_runs_temp_dir(
    spark_drivers_tmpdir: Path | None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if spark_drivers_tmpdir is None:
        # the caller's SPARK_SUBMIT_OPTS names a java.io.tmpdir: kept, and no second one added
        assert os.environ["SPARK_SUBMIT_OPTS"].count("-Djava.io.tmpdir=") == 1
        return
    assert spark_drivers_tmpdir.is_dir()
    assert spark_drivers_tmpdir.is_relative_to(tmp_path_factory.getbasetemp())
    assert f"-Djava.io.tmpdir={spark_drivers_tmpdir}" in os.environ["SPARK_SUBMIT_OPTS"].split()


def test_a_loads_scratch_warehouse_is_one_directory_in_the_users_cache_not_one_per_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark's default catalog needs a directory, which the loader never writes into: one per
    load in /tmp was left behind by every driver that was SIGKILLed."""
    monkeypatch.setenv("HOME", str(tmp_path))
    first, second = _scratch_warehouse(), _scratch_warehouse()
    assert first == second == str(tmp_path / ".cache" / "logbroker" / "spark-warehouse")
    assert Path(first).is_dir()
