"""Delta Lake's Spark connector: which jars, where Ivy keeps them, and the session settings.

The Python half (``delta-spark``) comes from PyPI with the ``spark`` extra; the JVM half
(``io.delta:delta-spark_<spark major.minor>_2.13`` of the same version, and its dependencies)
comes from Maven Central through ``spark.jars.packages``.  Ivy resolves it once into
``~/.cache/logbroker/ivy`` (``LOGBROKER_IVY_DIR`` to move it), and the jars it resolved are
listed there (:func:`remember_resolved_jars`); later sessions take those jars as they are
(``spark.jars``), with no resolution: no network, about 1.5 s less to start, and no Ivy report
on stderr.  A listed jar gone from the cache, or another Delta or Spark version, resolves again.

A session that PySpark starts itself gets these settings from :func:`session_conf`.  A driver
that ``spark-submit`` started has its JVM already, so the same settings must be given to
``spark-submit``; ``python -m yt_loader.delta_connector`` prints them as arguments::

    spark-submit $(python -m yt_loader.delta_connector) ... ops/cli.py load ...
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import shlex
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

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


def resolved_jars_file() -> Path:
    """Where the jars Ivy resolved for these coordinates and exclusions are listed."""
    what = "\n".join((maven_coordinates(), *PROVIDED_BY_SPARK))
    return ivy_dir() / f"resolved-{hashlib.sha256(what.encode()).hexdigest()[:16]}.txt"


def resolved_jars() -> str | None:
    """The ``spark.jars`` value of a session that resolved the same jars before, if every jar
    it lists is still in the cache."""
    try:
        listed = resolved_jars_file().read_text().strip()
    except (OSError, UnicodeError):
        return None
    uris = listed.split(",") if listed else []
    if not uris or not all(Path(urlsplit(uri).path).is_file() for uri in uris):
        return None
    return listed


def remember_resolved_jars(spark_jars: str) -> None:
    """List the jars a session's resolution gave (its ``spark.jars``, those in Ivy's cache),
    for the next session; a cache that cannot be written is left as it is."""
    cache = str(ivy_dir().resolve())
    uris = [u for u in spark_jars.split(",") if urlsplit(u).path.startswith(cache + os.sep)]
    if not uris:
        return
    target = resolved_jars_file()
    with contextlib.suppress(OSError):
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=".resolved-")
        try:
            with os.fdopen(fd, "w") as out:
                out.write(",".join(uris) + "\n")
            os.replace(temp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)


def session_conf(*, resolved: bool = True) -> dict[str, str]:
    """The Spark settings that load Delta into a session (all static: set before start-up):
    the jars resolved before (``resolved=True`` and listed) or their Maven coordinates."""
    delta = {
        "spark.sql.extensions": DELTA_EXTENSION,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
    }
    jars = resolved_jars() if resolved else None
    if jars is not None:
        return {"spark.jars": jars, **delta}
    return {
        "spark.jars.packages": maven_coordinates(),
        "spark.jars.excludes": ",".join(PROVIDED_BY_SPARK),
        "spark.jars.ivy": str(ivy_dir()),
        **delta,
    }


def spark_submit_args() -> list[str]:
    """:func:`session_conf` as ``spark-submit`` arguments (``--packages``, ``--conf``).

    Always the coordinates: ``spark-submit`` may run on a machine whose cache lists nothing.
    """
    args: list[str] = []
    for key, value in session_conf(resolved=False).items():
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
