"""The code is linted, formatted and type-checked: the same checks a reviewer would run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = [
    "log_store",
    "session_dedup",
    "ingest_api",
    "push_client",
    "delivery",
    "yt_loader",
    "ops",
]


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_check_finds_nothing() -> None:
    result = run(sys.executable, "-m", "ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_leaves_every_file_as_it_is() -> None:
    result = run(sys.executable, "-m", "ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_finds_no_type_errors_in_the_packages() -> None:
    result = run(sys.executable, "-m", "mypy", *[arg for p in PACKAGES for arg in ("-p", p)])
    assert result.returncode == 0, result.stdout + result.stderr
