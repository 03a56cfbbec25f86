"""The Spark session of the loader: ``local[*]`` by default, or what ``spark-submit`` set."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from yt_loader.data_source import register

DEFAULT_MASTER = "local[*]"


def launched_by_spark_submit() -> bool:
    """True inside a driver that ``spark-submit`` started (it hands over its JVM gateway)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(master: str | None = None, app_name: str = "logbroker load") -> SparkSession:
    """A session with the ``logbroker`` format registered.

    ``master=None`` means the master ``spark-submit`` was given, or ``local[*]`` when run
    directly.  A local master runs executors' Python with this interpreter, so they import
    the same logbroker code as the driver.
    """
    if master is None and not launched_by_spark_submit():
        master = DEFAULT_MASTER
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            builder = builder.config("spark.ui.enabled", "false")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    spark = builder.getOrCreate()
    register(spark)
    return spark
