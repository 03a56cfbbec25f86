"""The Spark session of the loader: ``local[*]`` by default, or what ``spark-submit`` set.

Every session it builds has Delta Lake loaded (see :mod:`yt_loader.delta_connector`) and the
``logbroker`` format registered.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from yt_loader.data_source import register
from yt_loader.delta_connector import (
    DELTA_EXTENSION,
    remember_resolved_jars,
    session_conf,
    spark_submit_args,
)
from yt_loader.errors import BadSourceOptions

DEFAULT_MASTER = "local[*]"
LOOPBACK = "127.0.0.1"
DEFAULT_LOG_LEVEL = "WARN"
LOG_LEVELS = ("ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")
LOG_LEVEL_CONF = "spark.log.level"
WAREHOUSE_CONF = "spark.sql.warehouse.dir"

DELTA_STATE_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
"""Spark partitions Delta uses to rebuild a table's state from its log: 50 unless set, which
costs seconds of task start-up per commit on a small cluster for a log table's files; the
loader uses the cluster's cores instead unless the user set it."""


_MASTER = re.compile(
    r"local(\[(\*|[1-9]\d*)(,\s*[1-9]\d*)?\])?|local-cluster\[\d+,\s*\d+,\s*\d+\]"
    r"|yarn|(spark|k8s)://\S+"
)


def check_master(master: str) -> None:
    """Refuse (``BadSourceOptions``) a master URL Spark would not take, before a JVM starts
    for it: Spark's own answer is a stack trace from a JVM that exited."""
    if not _MASTER.fullmatch(master):
        raise BadSourceOptions(
            f"--master {master!r} is not a Spark master: give local, local[N], local[*], "
            "spark://HOST:PORT, yarn or k8s://URL"
        )


def check_log_level(level: str) -> str:
    """``level`` in upper case if Spark's log takes it, else ``BadSourceOptions``."""
    if level.upper() not in LOG_LEVELS:
        raise BadSourceOptions(f"Spark log level {level!r} is not one of {', '.join(LOG_LEVELS)}")
    return level.upper()


def launched_by_spark_submit() -> bool:
    """True inside a driver that ``spark-submit`` started (it hands over its JVM gateway)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def streams_merged() -> bool:
    """True if stderr is stdout (one pipe or file, not a terminal), as in a driver that
    ``spark-submit`` started: its PythonRunner reads the two as one stream."""
    try:
        out, err = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return os.path.samestat(out, err) and not sys.stdout.isatty()


def build_session(
    master: str | None = None,
    app_name: str = "logbroker load",
    conf: dict[str, str] | None = None,
    with_delta: bool = True,
    log_level: str | None = None,
) -> SparkSession:
    """A session with Delta Lake loaded and the ``logbroker`` format registered.

    ``with_delta=False`` leaves Delta out (the Parquet warehouse needs no jars).

    ``log_level``: the driver's Spark log level (``spark.log.level``).  ``None`` keeps a
    ``spark.log.level`` the session was given (``spark-submit --conf``), else
    :data:`DEFAULT_LOG_LEVEL`: a driver ``spark-submit`` starts logs at INFO, hundreds of
    lines per load on the stderr that carries the loader's own progress.

    ``master=None`` means the master ``spark-submit`` was given, or ``local[*]`` when run
    directly.  Executors run their Python with this interpreter unless
    ``spark.pyspark.python`` says otherwise (on a cluster: logbroker installed at the same
    path on every node).  A local master binds to loopback and shows no UI.
    """
    submitted = launched_by_spark_submit()
    if master is None and not submitted:
        master = DEFAULT_MASTER
    builder = SparkSession.builder.appName(app_name)
    delta_conf: dict[str, str] = {}
    if not submitted:
        if with_delta:
            # jars of the caller's own replace the ones listed: resolve Delta's then
            delta_conf = session_conf(resolved="spark.jars" not in (conf or {}))
            for key, value in delta_conf.items():
                builder = builder.config(key, value)
        python = (conf or {}).get("spark.pyspark.python", sys.executable)
        builder = builder.config("spark.pyspark.python", python)
        # PySpark gives its Python functions the interpreter PYSPARK_PYTHON names ("python3"
        # when unset), and executors run that one whatever spark.pyspark.python says (only
        # spark-submit turns the setting into the variable): on a cluster "python3" is
        # whatever the worker's PATH finds, without logbroker.
        os.environ.setdefault("PYSPARK_PYTHON", python)
    if not _warehouse_given(conf, submitted):
        # Spark makes its catalog's warehouse, ./spark-warehouse, in the directory the driver
        # was started from; logbroker keeps no table there (tables are paths), so none is left
        builder = builder.config(WAREHOUSE_CONF, _scratch_warehouse())
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
            builder = (
                builder.config("spark.ui.enabled", "false")
                .config("spark.driver.host", LOOPBACK)
                .config("spark.driver.bindAddress", LOOPBACK)
            )
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    given = (conf or {}).get(LOG_LEVEL_CONF) or _submitted_log_level(submitted)
    level = check_log_level(log_level or given or DEFAULT_LOG_LEVEL)
    # From the SparkContext's start, which is this getOrCreate's even under spark-submit: a
    # Python driver's JVM has none before (set after it, the level let ~100 INFO lines out).
    builder = builder.config(LOG_LEVEL_CONF, level)
    for key, value in (conf or {}).items():
        if key != LOG_LEVEL_CONF:
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if log_level is not None or spark.conf.get(LOG_LEVEL_CONF, None) is None:
        # spark-submit's driver (or a session made before) has its SparkContext already.
        # Spark skips a level equal to its root logger's, and a PySpark driver's root logger
        # is at INFO already while a console filter shows it WARN and up: another level
        # first makes the wanted one take effect (and lifts that filter).
        spark.sparkContext.setLogLevel("OFF" if level != "OFF" else "ALL")
        spark.sparkContext.setLogLevel(level)
    if with_delta:
        _check_delta_loaded(spark)
        if "spark.jars.packages" in delta_conf:
            remember_resolved_jars(spark.sparkContext.getConf().get("spark.jars", ""))
        if spark.conf.get(DELTA_STATE_PARTITIONS, None) is None:
            cores = max(2, spark.sparkContext.defaultParallelism)
            spark.conf.set(DELTA_STATE_PARTITIONS, str(cores))
    register(spark)
    return spark


def _warehouse_given(conf: dict[str, str] | None, submitted: bool) -> bool:
    """True if the caller chose Spark's warehouse directory: in ``conf``, or (``submitted``)
    in spark-submit's ``--conf`` or spark-defaults.conf."""
    if WAREHOUSE_CONF in (conf or {}):
        return True
    if not submitted:
        return False
    # spark-submit gave its settings to its JVM as system properties, which a SparkConf made
    # once PySpark is connected to that JVM reads
    SparkContext._ensure_initialized()
    return bool(SparkConf().contains(WAREHOUSE_CONF))


def _submitted_log_level(submitted: bool) -> str | None:
    """The ``spark.log.level`` that spark-submit's ``--conf`` or spark-defaults.conf gave."""
    if not submitted:
        return None
    SparkContext._ensure_initialized()
    return SparkConf().get(LOG_LEVEL_CONF, None)


def _scratch_warehouse() -> str:
    """An empty directory for Spark's default catalog: ``~/.cache/logbroker/spark-warehouse``,
    shared by every load of the user (none writes into it).

    Not a directory per load: a driver that is SIGKILLed runs no exit handler, and left its
    own behind in /tmp.  A home that cannot hold it gets one per load, removed at exit.
    """
    shared = Path.home() / ".cache" / "logbroker" / "spark-warehouse"
    try:
        shared.mkdir(parents=True, exist_ok=True)
    except OSError:
        path = tempfile.mkdtemp(prefix="logbroker-spark-warehouse-")
        atexit.register(shutil.rmtree, path, True)
        return path
    return str(shared)


def _check_delta_loaded(spark: SparkSession) -> None:
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    if DELTA_EXTENSION not in extensions:
        raise BadSourceOptions(
            "Delta Lake is not loaded in this Spark session; give spark-submit these "
            f"arguments: {' '.join(spark_submit_args())} "
            "(printed by: python -m yt_loader.delta_connector)"
        )
