"""One splitter of ``URL[,URL...]`` for every ``--server`` and the loader's ``server``, and
what each of its callers refuses (a list that names no gateway, an item that is no URL)."""

from __future__ import annotations

import subprocess

import pytest

from delivery.gateway_retry import gateway_urls
from log_store.errors import LogbrokerError
from ops.gateway_client import GatewayClient
from tests.conftest import REPO, logbroker_cmd
from yt_loader.errors import BadSourceOptions
from yt_loader.log_source import SourceSpec


def test_the_list_is_split_on_commas_stripped_and_empty_items_left_out() -> None:
    assert gateway_urls("http://a:8080") == ("http://a:8080",)
    assert gateway_urls(" http://a:8080/ ,, http://b:8080// ,") == (
        "http://a:8080",
        "http://b:8080",
    )
    assert gateway_urls("") == ()
    assert gateway_urls(" , ,") == ()


@pytest.mark.parametrize(
    ("server", "refused"),
    [
        (",", "--server ',' is not an http:// or https:// URL"),
        ("http://a:8080,b:8080", "--server 'b:8080' is not an http:// or https:// URL"),
    ],
)
def test_read_refuses_a_list_without_a_url_with_exit_2(server: str, refused: str) -> None:
    done = subprocess.run(
        logbroker_cmd("read", "--server", server, "--topic", "dc1.app"),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"logbroker read: {refused}"


def test_the_gateway_commands_refuse_a_list_that_names_no_gateway() -> None:
    with pytest.raises(LogbrokerError, match=r"^--server ' , ' names no gateway URL$"):
        GatewayClient(" , ", command="topics")


def test_the_loader_refuses_a_list_that_names_no_gateway_or_holds_no_url() -> None:
    with pytest.raises(BadSourceOptions, match=r"^server must name a gateway: URL\[,URL\.\.\.\]$"):
        SourceSpec(server=" , ")
    with pytest.raises(BadSourceOptions, match="server must be an http:// or https:// URL: 'b:1'"):
        SourceSpec(server="http://a:1/, b:1")
    assert (
        SourceSpec(server="http://a:1/, http://b:1").describe() == "gateways http://a:1, http://b:1"
    )
