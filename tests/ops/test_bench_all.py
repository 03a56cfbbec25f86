"""``logbroker bench all``: every benchmark in one run, one table with the machine; ``bench list``.

The benchmarks themselves really run (the cheapest two, with ``--quick``); what is checked is
the shape of what the command collects and prints, never a speed.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, logbroker_cmd

CHEAPEST = ["store", "new_sources"]


def _descendants(pid: int) -> dict[int, str]:
    """pid -> command line of every living process below ``pid`` (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    cmdlines: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        cmdlines[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    found: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found[child] = cmdlines[child]
        todo += children.get(child, [])
    return found


@pytest.mark.slow
def test_bench_all_quick_runs_each_benchmark_and_prints_one_table_with_the_machine(
    tmp_path: Path,
) -> None:
    markdown, report = tmp_path / "bench.md", tmp_path / "bench.json"
    only = ",".join(CHEAPEST)
    args = ["bench", "all", "--quick", "--only", only, "--markdown", str(markdown)]
    done = subprocess.run(
        logbroker_cmd(*args, "--json", str(report)),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    # the table is the command's only standard output, and the README-ready file is the same
    assert markdown.read_text() == done.stdout
    # each benchmark's own table went to stderr as it ran
    assert "== store:" in done.stderr and "== new_sources:" in done.stderr

    document = json.loads(report.read_text())
    assert document["quick"] is True and document["runs"] == 1
    assert document["command"].startswith("logbroker bench all --quick")
    machine = document["machine"]
    assert machine["cores"] >= 1 and machine["memory_gib"] > 0
    for field in ("cpu_model", "disk", "kernel", "load_average"):
        assert machine[field], field
    assert [b["name"] for b in document["benchmarks"]] == CHEAPEST
    for bench in document["benchmarks"]:
        assert bench["error"] is None
        assert bench["figures"], bench["name"]
        for figure in bench["figures"]:
            assert math.isfinite(figure["value"]) and figure["value"] > 0, figure
            assert figure["unit"] and figure["runs"], figure

    store = document["benchmarks"][0]["figures"]
    # one run per case, and the dd reference is the median of the dd run before each case
    assert all(len(f["runs"]) == 1 for f in store[1:])
    assert len(store[0]["runs"]) == len(store) - 1

    assert store[0]["name"].startswith("dd ") and store[0]["unit"] == "MB/s"
    # every store case is compared with the dd run just before it
    assert all(
        [c["peer"] for c in f["against"]] == ["dd"] and c["style"] == "percent"
        for f in store[1:]
        for c in f["against"]
    )
    assert all(f["against"] for f in store[1:])

    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"`logbroker bench all --quick --only {only}")
    assert " UTC" in lines[0]
    machine_line = next(line for line in lines if line.startswith("Machine: "))
    for field in ("cpu_model", "kernel"):
        assert machine[field] in machine_line
    assert f"{machine['cores']} cores" in machine_line
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| bench")]
    figures = [f for b in document["benchmarks"] for f in b["figures"]]
    assert len(rows) == len(figures)
    assert all(row.count(" | ") == 3 for row in rows)
    assert any("% of dd |" in row for row in rows)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--only", "store,nonesuch"], "unknown benchmark(s) nonesuch"),
        (["--only", ","], "(none given)"),
        (["--runs", "0"], "--runs must be at least 1"),
        (["--runs", "three"], "invalid int value"),
        (["--fast"], "unrecognized arguments: --fast"),
        (["--markdown", "/nonexistent-dir/bench.md"], "no directory /nonexistent-dir"),
    ],
)
def test_bench_all_refuses_bad_arguments_with_exit_2_before_running_anything(
    tmp_path: Path, args: list[str], message: str
) -> None:
    report = tmp_path / "bench.json"
    done = subprocess.run(
        logbroker_cmd("bench", "all", "--json", str(report), *args),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert "==" not in done.stderr and done.stdout == ""
    assert not report.exists()


def test_bench_list_names_every_benchmark_script_and_its_peers() -> None:
    done = subprocess.run(
        logbroker_cmd("bench", "list"), cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    listed = [line.split(":")[0] for line in done.stdout.splitlines() if not line[:1].isspace()]
    scripts = {p.stem.removesuffix("_bench") for p in (REPO / "benchmarks").glob("*_bench.py")}
    assert sorted(listed) == sorted(scripts)
    assert "rsyslog" in done.stdout and "dd" in done.stdout


def test_bench_unknown_name_exits_2_with_the_choices() -> None:
    done = subprocess.run(
        logbroker_cmd("bench", "nonesuch"), cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "no benchmark 'nonesuch'" in done.stderr and "store" in done.stderr


@pytest.mark.slow
@pytest.mark.fault
def test_sigterm_stops_bench_all_and_every_process_of_the_running_benchmark(
    tmp_path: Path,
) -> None:
    report = tmp_path / "bench.json"
    proc = subprocess.Popen(
        logbroker_cmd("bench", "all", "--quick", "--only", "new_sources", "--json", str(report)),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        # the benchmark's own gateway is up: stop the command in the middle of the run
        deadline = time.monotonic() + 120
        below = _descendants(proc.pid)
        while not any(" serve " in cmd for cmd in below.values()):
            assert time.monotonic() < deadline, "the benchmark never started its gateway"
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.05)
            below = _descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err.decode()[-2000:]
    assert b"stopped" in err
    # a SIGKILLed process may still be finishing an fsync (uninterruptible) for a moment
    deadline = time.monotonic() + 15
    left = [pid for pid in below if _alive(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [pid for pid in left if _alive(pid)]
    assert left == [], [below[pid] for pid in left]
    # what ran is still reported: the benchmark that was stopped, as stopped
    document = json.loads(report.read_text())
    assert [(b["name"], b["error"]) for b in document["benchmarks"]] == [("new_sources", "stopped")]
    assert b"new_sources | did not run: stopped" in out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; pytest, their reaper, collects it later


def test_runs_of_a_script_without_runs_are_joined_into_medians_of_figures_and_ratios(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from benchmark_results import Comparison, Figure
    from suite import merge_invocations

    def one_run(mb: float, ratio: float) -> list[Figure]:
        return [
            Figure("ingest", mb, "MB/s", [mb], [Comparison("peer", ratio)]),
            Figure("latency p99", mb / 10, "ms", [mb / 10]),
        ]

    merged = merge_invocations([one_run(100, 1.0), one_run(300, 3.0), one_run(200, 1.5)])
    assert [(f.name, f.value, f.runs) for f in merged] == [
        ("ingest", 200, [100, 300, 200]),
        ("latency p99", 20, [10, 30, 20]),
    ]
    assert merged[0].against == [Comparison("peer", 1.5)]
    assert merged[1].against == []
