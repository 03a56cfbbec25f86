"""``logbroker read`` of the gateways' internal topics, which are never listed nor readable:
refused at once (exit 2), never waited for."""

from __future__ import annotations

from typing import Any


def test_reading_an_internal_topic_or_prefix_exits_2_with_the_reason(
    gateway: Any, start_reader: Any
) -> None:
    forms = {
        ("logbroker-internal.delivery",): "names one of the gateways' internal topics",
        ("logbroker-internal.*",): "names only the gateways' internal topics",
        ("logbroker-internal.delivery", "--group", "g"): "names one of the gateways' internal",
        ("logbroker-internal.*", "--group", "g"): "names only the gateways' internal topics",
    }
    readers = {form: start_reader("--server", gateway.url, "--topic", *form) for form in forms}
    for form, reason in forms.items():
        assert readers[form].wait(30) == 2, (form, readers[form].stderr())
        said = readers[form].stderr()
        assert reason in said and "which no one reads" in said, (form, said)
