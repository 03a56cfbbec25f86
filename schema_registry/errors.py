"""What the schema registry refuses, each a :class:`~log_store.errors.BadRequest`."""

from __future__ import annotations

from log_store.errors import BadRequest


class InvalidSchema(BadRequest):
    """Text that is not an Avro schema fastavro accepts, or not a record schema."""


class IncompatibleSchema(BadRequest):
    """A new version that breaks the log type's compatibility mode; ``problems`` says how."""

    def __init__(self, message: str, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


class UnknownSchema(BadRequest):
    """No such log type, version or schema id in the registry."""


class BadRecord(BadRequest):
    """A line of a structured chunk that is not a record of the log type's schema."""
