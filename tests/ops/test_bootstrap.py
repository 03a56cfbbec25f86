"""scripts/bootstrap.sh installs Python packages only when no earlier install covers them.

The quick start sources it with no extras while the test suite, installed with all of them,
runs from the same venv: installing again would rewrite `.venv/bin/logbroker` under the tests
that run it at that moment ("logbroker: command not found").
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _fake_repo(tmp_path: Path, installed_extras: str) -> tuple[Path, Path]:
    """A repo with the real bootstrap script, a venv whose python only records its calls,
    and the stamp of an earlier install with ``installed_extras``."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "bootstrap.sh", tmp_path / "scripts" / "bootstrap.sh")
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n')
    calls = tmp_path / "calls"
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    python.chmod(0o755)
    digest = hashlib.sha1(pyproject.read_bytes()).hexdigest()[:12]
    (tmp_path / ".venv" / f".installed-{digest}-{installed_extras}").touch()
    return tmp_path, calls


def _bootstrap(repo: Path, extras: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f'LOGBROKER_EXTRAS="{extras}" source scripts/bootstrap.sh'],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_install_with_more_extras_covers_one_with_fewer(tmp_path: Path) -> None:
    repo, calls = _fake_repo(tmp_path, "test_spark")
    for extras in ("", "test", "spark", "test,spark"):
        done = _bootstrap(repo, extras)
        assert done.returncode == 0, done.stderr
        assert "installing Python packages" not in done.stderr, extras
    assert not calls.exists(), calls.read_text()


def test_an_extra_not_installed_yet_is_installed(tmp_path: Path) -> None:
    repo, calls = _fake_repo(tmp_path, "test")
    done = _bootstrap(repo, "test,spark")
    assert done.returncode == 0, done.stderr
    assert "installing Python packages (test,spark)" in done.stderr
    assert "pip install -q -e" in calls.read_text()
    # and the install is remembered: the next run installs nothing
    calls.unlink()
    assert _bootstrap(repo, "spark").returncode == 0
    assert not calls.exists()
