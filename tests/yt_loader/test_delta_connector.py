"""Delta's jars: resolved by Ivy once, listed, and taken as they are by later sessions."""

from __future__ import annotations

from pathlib import Path

import pytest

from yt_loader.delta_connector import (
    IVY_DIR_ENV,
    maven_coordinates,
    remember_resolved_jars,
    resolved_jars_file,
    session_conf,
    spark_submit_args,
)


def test_jars_resolved_once_are_taken_as_listed_until_one_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ivy = tmp_path / "ivy"
    (ivy / "jars").mkdir(parents=True)
    monkeypatch.setenv(IVY_DIR_ENV, str(ivy))
    assert session_conf()["spark.jars.packages"] == maven_coordinates()  # nothing listed yet

    jars = [ivy / "jars" / "io.delta_delta-spark.jar", ivy / "jars" / "io.delta_storage.jar"]
    for jar in jars:
        jar.write_bytes(b"PK")
    elsewhere = tmp_path / "user.jar"  # a jar of the user's own is not Delta's to list
    remember_resolved_jars(",".join([*(f"file://{j}" for j in jars), f"file://{elsewhere}"]))
    conf = session_conf()
    assert conf["spark.jars"] == ",".join(f"file://{j}" for j in jars)
    assert "spark.jars.packages" not in conf
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert "spark.jars.packages" in session_conf(resolved=False)
    assert "--packages" in spark_submit_args()  # spark-submit may run where nothing is listed

    jars[1].unlink()  # a cache cleaned by hand: resolve again
    assert session_conf()["spark.jars.packages"] == maven_coordinates()
    resolved_jars_file().write_bytes(b"\xff\xfe")  # a list that is not text: resolve again
    assert "spark.jars.packages" in session_conf()


def test_a_cache_that_cannot_be_written_lists_nothing_and_fails_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(IVY_DIR_ENV, str(tmp_path / "missing"))
    remember_resolved_jars(f"file://{tmp_path / 'missing' / 'jars' / 'a.jar'}")
    assert not resolved_jars_file().exists()
    assert "spark.jars.packages" in session_conf()
