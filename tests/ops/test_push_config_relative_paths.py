"""Relative paths in a push-client config file are taken from the working directory (as on
the command line), not the file's; a client started elsewhere says what they resolve to."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import REPO, free_port, logbroker_cmd


def test_relative_paths_of_a_config_elsewhere_are_named_resolved(tmp_path: Path) -> None:
    (tmp_path / "rc" / "logs").mkdir(parents=True)
    (tmp_path / "rc" / "logs" / "a.log").write_text("rel-line\n")
    config = tmp_path / "rc" / "push.toml"
    config.write_text(
        f'[push]\nservers = ["http://127.0.0.1:{free_port()}"]\nstate_dir = "state"\n'
        '[[entry]]\npath = "logs/*.log"\nlog_type = "relcfg"\n'
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        logbroker_cmd("push", "--config", str(config), "--idle-exit", "1"),
        cwd=elsewhere,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (
        f"logbroker push: warning: {config} gives relative paths, taken from the working "
        f"directory {elsewhere}, not the file's: state_dir state is {elsewhere / 'state'}; "
        f"path logs/*.log is {elsewhere / 'logs'}/*.log\n"
    ) in done.stderr
    assert (elsewhere / "state").is_dir() and not (tmp_path / "rc" / "state").exists()
