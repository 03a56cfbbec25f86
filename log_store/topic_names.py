"""Topic names: what is allowed, so that a name can never act as a path."""

from __future__ import annotations

import re

from log_store.errors import InvalidTopicName

TOPIC_NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,200}")


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
