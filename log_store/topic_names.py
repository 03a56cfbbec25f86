"""Topic names and the log types they are made of: what is allowed, so a name is never a path.

A gateway writes log type ``T`` of data center ``D`` to topic ``D.T``.  The log-type rule lives
here, once, and every part that takes a log type uses it: the gateway's write and legacy
endpoints, the push-client's configuration, the command line.  A valid log type always makes
a valid topic name (a data center name has at most 32 characters).
"""

from __future__ import annotations

import re

from log_store.errors import InvalidTopicName

TOPIC_NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,200}")
MAX_LOG_TYPE_CHARS = 100
LOG_TYPE_PATTERN = re.compile(rf"[a-z0-9][a-z0-9._-]{{0,{MAX_LOG_TYPE_CHARS - 1}}}")
LOG_TYPE_RULE = (
    f"1-{MAX_LOG_TYPE_CHARS} characters of [a-z0-9._-], starting with a letter or digit, "
    "without '..'"
)


class InvalidLogType(InvalidTopicName):
    """A log type outside :data:`LOG_TYPE_PATTERN` (or holding ``..``)."""


def validate_topic_name(name: object) -> str:
    """Return ``name`` if it is a valid topic name, else raise :class:`InvalidTopicName`."""
    if not isinstance(name, str):
        raise InvalidTopicName(f"topic name must be a string, got {type(name).__name__}")
    if not TOPIC_NAME_PATTERN.fullmatch(name):
        shown = name if len(name) <= 60 else name[:60] + "..."
        raise InvalidTopicName(
            f"invalid topic name {shown!r}: use 1-201 characters of [a-z0-9._-], "
            "starting with a letter or digit"
        )
    if ".." in name:
        raise InvalidTopicName(f"invalid topic name {name!r}: '..' is not allowed")
    return name


def is_valid_log_type(value: object) -> bool:
    return isinstance(value, str) and bool(LOG_TYPE_PATTERN.fullmatch(value)) and ".." not in value


def validate_log_type(value: object) -> str:
    """Return ``value`` if it can name a log type, else raise :class:`InvalidLogType`."""
    if not is_valid_log_type(value):
        shown = repr(value)[:80]
        raise InvalidLogType(f"invalid log_type {shown}: use {LOG_TYPE_RULE}")
    assert isinstance(value, str)
    return value
