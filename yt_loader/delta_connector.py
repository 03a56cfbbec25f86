"""Delta Lake's Spark connector: which jars, where Ivy keeps them, and the session settings.

The Python half (``delta-spark``) comes from PyPI with the ``spark`` extra; the JVM half
(``io.delta:delta-spark_<spark major.minor>_2.13`` of the same version, and its dependencies)
comes from Maven Central through ``spark.jars.packages``.  Ivy resolves it once into
``~/.cache/logbroker/ivy`` (``LOGBROKER_IVY_DIR`` to move it); later sessions find every jar
there and need no network.

A session that PySpark starts itself gets these settings from :func:`session_conf`.  A driver
that ``spark-submit`` started has its JVM already, so the same settings must be given to
``spark-submit``; ``python -m yt_loader.delta_connector`` prints them as arguments::

    spark-submit $(python -m yt_loader.delta_connector) ... ops/cli.py load ...
"""

from __future__ import annotations

import importlib.metadata
import os
import shlex
from pathlib import Path

import pyspark

SCALA_VERSION = "2.13"
IVY_DIR_ENV = "LOGBROKER_IVY_DIR"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
PROVIDED_BY_SPARK = (
    "org.apache.hadoop:hadoop-client-api",
    "org.apache.hadoop:hadoop-client-runtime",
    "org.apache.parquet:parquet-hadoop",
    "org.apache.parquet:parquet-column",
    "org.apache.parquet:parquet-common",
    "org.apache.parquet:parquet-encoding",
    "org.apache.parquet:parquet-format-structures",
    "org.apache.parquet:parquet-jackson",
    "com.fasterxml.jackson.core:jackson-databind",
    "com.fasterxml.jackson.core:jackson-core",
    "com.fasterxml.jackson.core:jackson-annotations",
    "org.apache.logging.log4j:log4j-api",
    "org.apache.logging.log4j:log4j-core",
    "org.apache.logging.log4j:log4j-slf4j2-impl",
    "org.slf4j:slf4j-api",
    "org.xerial.snappy:snappy-java",
    "com.github.luben:zstd-jni",
    "io.airlift:aircompressor",
    "commons-pool:commons-pool",
    "com.google.code.findbugs:jsr305",
    "org.roaringbitmap:RoaringBitmap",
    "org.locationtech.jts:jts-core",
)
"""Delta's Maven dependencies that PySpark's own ``jars/`` already has (in newer versions):
left out of the resolution, so that executors do not fetch ~80 MB of jars whose classes Spark's
class path would shadow anyway."""


def delta_version() -> str:
    """The installed ``delta-spark`` Python package's version; the jars must match it."""
    return importlib.metadata.version("delta-spark")


def maven_coordinates() -> str:
    """``io.delta:delta-spark_4.1_2.13:4.4.0`` for the installed PySpark and delta-spark."""
    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    return f"io.delta:delta-spark_{spark_minor}_{SCALA_VERSION}:{delta_version()}"


def ivy_dir() -> Path:
    """Where Ivy caches what it resolved: ``$LOGBROKER_IVY_DIR`` or ``~/.cache/logbroker/ivy``."""
    configured = os.environ.get(IVY_DIR_ENV)
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "logbroker" / "ivy"


def session_conf() -> dict[str, str]:
    """The Spark settings that load Delta into a session (all static: set before start-up)."""
    return {
        "spark.jars.packages": maven_coordinates(),
        "spark.jars.excludes": ",".join(PROVIDED_BY_SPARK),
        "spark.jars.ivy": str(ivy_dir()),
        "spark.sql.extensions": DELTA_EXTENSION,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
    }


def spark_submit_args() -> list[str]:
    """:func:`session_conf` as ``spark-submit`` arguments (``--packages``, ``--conf``)."""
    args: list[str] = []
    for key, value in session_conf().items():
        if key == "spark.jars.packages":
            args += ["--packages", value]
        elif key == "spark.jars.excludes":
            args += ["--exclude-packages", value]
        else:
            args += ["--conf", f"{key}={value}"]
    return args


def main() -> None:
    print(" ".join(shlex.quote(arg) for arg in spark_submit_args()))


if __name__ == "__main__":
    main()
