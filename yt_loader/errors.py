"""Errors of the loader and the Spark data source; all derive from ``LogbrokerError``."""

from __future__ import annotations

from log_store.errors import BadRequest, LogbrokerError


class BadSourceOptions(BadRequest):
    """The ``logbroker`` data source or the loader was given options it cannot use."""


class DataLost(LogbrokerError):
    """Offsets that should be read were dropped by retention before anyone read them."""


class WarehouseBusy(LogbrokerError):
    """Another loader holds the warehouse's lock."""


class WarehouseCorrupt(LogbrokerError):
    """The warehouse's commit log does not agree with its files or with the log."""


class SourceUnavailable(LogbrokerError):
    """The gateway could not be reached or answered with an error."""
