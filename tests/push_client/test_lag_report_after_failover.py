"""The lag report's recovery line names the gateway it failed at, not "again" elsewhere."""

from __future__ import annotations

import logging
import time

import pytest

from push_client.lag_report import LagReporter
from push_client.token import BearerToken
from tests.conftest import free_port
from tests.push_client.test_audit_publishing import _ROW
from tests.scripted_http import serving


def test_a_report_that_gets_through_at_another_gateway_says_so_not_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens: the installation that died
    caplog.set_level(logging.INFO, logger="logbroker.push")
    with serving(lambda _path: (200, 0.0)) as other:
        reporter = LagReporter("test-client", BearerToken(None, None), interval_s=0.02)
        try:

            def said(text: str) -> bool:
                return any(text in r.getMessage() for r in caplog.records)

            deadline = time.monotonic() + 10
            while not said("failed") and time.monotonic() < deadline:
                reporter.offer(down, [_ROW])
                time.sleep(0.01)
            while not said("lag reports reach") and time.monotonic() < deadline:
                reporter.offer(other.url, [_ROW])  # the client failed over to another DC
                time.sleep(0.01)
        finally:
            reporter.close()
    reached = [r.getMessage() for r in caplog.records if "lag reports reach" in r.getMessage()]
    # it said "lag reports reach OTHER again" of a gateway that had never been reached
    assert reached == [f"lag reports reach {other.url} (they failed at {down})"], reached
