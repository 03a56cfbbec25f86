"""Loading the log into tables with Spark, exactly once.

Follow a line through it in this order: ``log_source`` (the store, read-only, or a gateway;
decoded messages), ``offset_ranges`` (the unit of work), ``range_reader`` and ``line_rows``
(one Arrow row per log line), then either ``data_source`` (``spark.read.format("logbroker")``,
batch and streaming) or ``range_writer`` (one task attempt's Parquet files), ``load_job`` (the
batches, reported by ``load_report``) and ``load_target`` with its two formats:
``delta_table`` (a Delta Lake table, each batch one Delta commit of its files and offsets) and
``warehouse`` (Parquet directories with a commit log).  ``delta_connector`` and
``spark_session`` make the Spark session;
``standalone_cluster`` starts a local Spark cluster for tests and benchmarks.
"""
