"""A misspelt ``LOGBROKER_*`` setting is refused, never ignored, like a misspelt TOML key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ingest_api.settings import ConfigError, load_limits, load_settings

REPO = Path(__file__).resolve().parents[2]

# Every LOGBROKER_ variable other parts read (the command line, the tests, the bootstrap
# scripts, the workers a gateway starts): the settings must leave them alone.
OTHERS = {
    "LOGBROKER_TOKEN": "t",
    "LOGBROKER_TOKEN_FILE": "/t",
    "LOGBROKER_KAFKA": "1",
    "LOGBROKER_EXTRAS": "test",
    "LOGBROKER_TEST_WORKERS": "2",
    "LOGBROKER_AUDIT_INTERVAL_S": "60",
    "LOGBROKER_STORE_CRASH_AT": "after-segment-write",
    "LOGBROKER_LOADER_CRASH_AT": "x",
    "LOGBROKER_LEGACY_CRASH_AT": "after-claim",
    "LOGBROKER_LOADER_TASK_FAULT": "x",
    "LOGBROKER_SPARK_LOG_LEVEL": "WARN",
    "LOGBROKER_IVY_DIR": "/i",
    "LOGBROKER_DASHBOARD_SCREENSHOT": "/s.png",
    "LOGBROKER_GATEWAY_SETTINGS_JSON": "{}",
    "LOGBROKER_GATEWAY_SUPERVISOR_PID": "1",
}


@pytest.mark.parametrize(
    ("name", "named"),
    [
        ("LOGBROKER_LIMITS_BOGUS", "LOGBROKER_LIMITS_MAX_BODY_BYTES"),
        ("LOGBROKER_LIMITS_MAX_BODY_BYTE", "LOGBROKER_LIMITS_MAX_BODY_BYTES"),
        ("LOGBROKER_KAFKA_LINGER_MS", "the [kafka] table is set in the config file only"),
        ("LOGBROKER_KAFKA_BOOTSTRAPS", "LOGBROKER_KAFKA_BOOTSTRAP, LOGBROKER_KAFKA_NAMESPACE"),
        ("LOGBROKER_SSL_CERT", "LOGBROKER_SSL_CERTFILE, LOGBROKER_SSL_KEYFILE"),
        ("LOGBROKER_GRAPHITE_INTERVAL", "LOGBROKER_GRAPHITE_INTERVAL_S"),
        ("LOGBROKER_TOKENS_T1", "[tokens] table"),
    ],
)
def test_an_unknown_variable_of_a_settings_family_is_refused_with_the_known_ones(
    name: str, named: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(env={name: "1"}, flags={"data_dir": "/d"})
    assert f"unknown environment variable {name}:" in str(refused.value)
    assert named in str(refused.value)


def test_the_topics_tools_limits_refuse_a_misspelt_limit_too() -> None:
    with pytest.raises(ConfigError, match="LOGBROKER_LIMITS_MAX_TOPIC:"):
        load_limits(env={"LOGBROKER_LIMITS_MAX_TOPIC": "5"})


def test_the_variables_other_parts_read_are_left_alone() -> None:
    env = {
        **OTHERS,
        "LOGBROKER_LIMITS_MAX_TOPICS": "5",
        "LOGBROKER_KAFKA_NAMESPACE": "ns",
        "LOGBROKER_GRAPHITE_INTERVAL_S": "5",
    }
    settings = load_settings(env=env, flags={"data_dir": "/d"})
    assert (settings.limits.max_topics, settings.kafka_namespace) == (5, "ns")
    assert settings.graphite_interval_s == 5.0
    assert load_limits(env=env).max_topics == 5


def test_serve_with_a_misspelt_limit_exits_2_naming_it(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ops", "serve", "--data-dir", str(tmp_path), "--port", "0"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO), "LOGBROKER_LIMITS_BOGUS": "1"},
    )
    assert result.returncode == 2, result.stderr
    assert "unknown environment variable LOGBROKER_LIMITS_BOGUS" in result.stderr
    assert not list(tmp_path.iterdir()), "nothing is created before the settings are good"
