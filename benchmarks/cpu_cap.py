"""Cap a process at a number of CPU cores with a cgroup, as if it had a machine of its own.

On one small machine every process of a benchmark shares the same cores: a gateway, the
broker and the load processes slow each other down, so "two gateways carry 1.6x one" or "a
gateway carries 70% of what a raw producer carries" cannot show.  Giving each measured
process (each gateway, the raw producer) a CPU quota of its own measures what it would carry
with that many cores to itself, while the broker and the load processes use what is left.

Needs root and the cgroup ``cpu`` controller (v1 ``/sys/fs/cgroup/cpu`` or v2).  A process
joins its cgroup itself (``join``), before it starts threads or children, which inherit it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

_V1 = Path("/sys/fs/cgroup/cpu")
_V2 = Path("/sys/fs/cgroup")
_PERIOD_US = 100_000


class CapUnavailable(RuntimeError):
    """This machine gives no writable cgroup ``cpu`` controller."""


class CpuCap:
    """A cgroup of its own, capped at ``cpus`` cores (e.g. 0.5: half of one core)."""

    def __init__(self, name: str, cpus: float) -> None:
        if cpus <= 0:
            raise ValueError(f"a CPU cap must be above 0 cores, not {cpus}")
        self.cpus = cpus
        quota = max(1000, round(cpus * _PERIOD_US))
        try:
            if (_V1 / "cpu.cfs_quota_us").exists():
                self.path = _V1 / f"logbroker-bench-{name}-{os.getpid()}"
                self.path.mkdir(exist_ok=True)
                (self.path / "cpu.cfs_period_us").write_text(str(_PERIOD_US))
                (self.path / "cpu.cfs_quota_us").write_text(str(quota))
            elif "cpu" in (_V2 / "cgroup.controllers").read_text().split():
                with contextlib.suppress(OSError):  # enabled already, or not ours to enable
                    (_V2 / "cgroup.subtree_control").write_text("+cpu")
                self.path = _V2 / f"logbroker-bench-{name}-{os.getpid()}"
                self.path.mkdir(exist_ok=True)
                (self.path / "cpu.max").write_text(f"{quota} {_PERIOD_US}")
            else:
                raise CapUnavailable("the cgroup cpu controller is not enabled")
        except OSError as exc:
            raise CapUnavailable(
                f"cannot make a cgroup to cap a process's CPU ({exc}); run as root on a "
                "machine with the cgroup cpu controller, or leave the cap out"
            ) from exc
        self.procs = str(self.path / "cgroup.procs")

    def remove(self) -> None:
        """Remove the cgroup (its processes must have ended)."""
        with contextlib.suppress(OSError):
            self.path.rmdir()


def join(procs: str) -> None:
    """Move the calling process into the cgroup whose ``cgroup.procs`` is ``procs``."""
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
