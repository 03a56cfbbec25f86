"""``logbroker load`` without PySpark says how to install it from the checkout.

logbroker is not published on PyPI: ``pip install 'logbroker[spark]'`` would install whatever
someone else publishes under that name.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ops.commands import load
from tests.conftest import REPO

_WITHOUT_PYSPARK = (
    "import sys\n"
    "sys.modules['pyspark'] = None  # as if it were not installed\n"
    "from ops.cli import main\n"
    "sys.exit(main())\n"
)


def test_load_without_pyspark_names_an_install_from_this_checkout(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_PYSPARK, "load", "--data-dir", str(tmp_path),
         "--warehouse", str(tmp_path / "w")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("logbroker load: needs pyspark; install the 'spark' extra")
    assert "pip install 'logbroker[spark]'" not in done.stderr
    assert (
        f"LOGBROKER_EXTRAS=spark {REPO}/scripts/bootstrap.sh" in done.stderr
        or f"-m pip install -e '{REPO}[spark]'" in done.stderr
    ), done.stderr


def test_the_hint_names_bootstrap_for_the_checkouts_venv_and_pip_for_another(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "prefix", str(REPO / ".venv"))
    assert load._spark_install_hint().endswith(
        f"LOGBROKER_EXTRAS=spark {REPO}/scripts/bootstrap.sh"
    )
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert load._spark_install_hint().endswith(
        f"{sys.executable} -m pip install -e '{REPO}[spark]'"
    )
