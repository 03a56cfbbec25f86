"""Loading the log into tables with Spark, exactly once.

Follow a line through it in this order: ``log_source`` (the store or a gateway, decoded
messages), ``offset_ranges`` (the unit of work), ``range_reader`` and ``line_rows`` (one Arrow
row per log line), then either ``data_source`` (``spark.read.format("logbroker")``, batch and
streaming) or ``range_writer``, ``warehouse`` and ``load_job`` (``logbroker load``: Parquet
tables, a commit log, recovery after a crash).
"""
