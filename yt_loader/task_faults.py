"""A test hook: make the first attempt of loader tasks fail or straggle, as clusters do.

``LOGBROKER_LOADER_TASK_FAULT=first-attempts`` in the executors' environment (``--conf
spark.executorEnv.LOGBROKER_LOADER_TASK_FAULT=first-attempts``, or the driver's environment in
``local`` mode) acts once the first attempt of a task has written part of its files:

- on an even Spark partition the attempt fails (Spark runs the task again, up to
  ``spark.task.maxFailures``);
- on an odd one it stalls for up to :data:`STALL_S` seconds, a straggler: with
  ``spark.speculation`` a copy of the task on another host overtakes it and Spark kills it.

The speculation test uses it to prove that only the files of the attempt Spark accepted are
committed; it has no other use.
"""

from __future__ import annotations

import os
import time

from log_store.errors import LogbrokerError

TASK_FAULT_ENV = "LOGBROKER_LOADER_TASK_FAULT"
FIRST_ATTEMPTS = "first-attempts"
STALL_S = 90.0


class TaskFaultInjected(LogbrokerError):
    """The failure the hook injects into a first attempt."""


def after_partial_write() -> None:
    """Fail or stall here if the hook is armed and this is a task's first attempt."""
    if os.environ.get(TASK_FAULT_ENV) != FIRST_ATTEMPTS:
        return
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None or context.attemptNumber() > 0:
        return
    if context.partitionId() % 2 == 0:
        raise TaskFaultInjected(
            f"{TASK_FAULT_ENV}: first attempt of task {context.partitionId()} fails"
        )
    time.sleep(STALL_S)
