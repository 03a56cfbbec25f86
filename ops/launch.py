"""The ``logbroker`` console script: signals first, then the command.

:func:`ops.stop_signals.install` runs before anything else of the command is imported, as
``python -m ops`` does: a SIGHUP or SIGTERM that comes while the command starts is recorded,
not the end of the process.  Imported from ``ops.cli`` it came after that module's imports,
and the interpreter's start plus those left a push-client without a SIGHUP handler for 88 ms
(median of 15 starts on a busy host) against 63 ms through ``python -m ops``.
"""

from ops import stop_signals

stop_signals.install()

from ops.cli import main  # noqa: E402

__all__ = ["main"]
