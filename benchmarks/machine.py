"""What machine a benchmark ran on: CPU model, cores, memory, the disk it wrote to, the kernel.

Read from Linux's ``/proc`` and ``/sys``; a field the machine does not expose reads "unknown".
The load average is part of it because on a shared machine it says how much the figures of one
run were disturbed by other work.
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

UNKNOWN = "unknown"


@dataclass
class Machine:
    cpu_model: str
    cores: int
    memory_gib: float
    disk: str
    kernel: str
    python: str
    load_average: str

    def describe(self) -> str:
        """One line for the head of a table."""
        return (
            f"{self.cpu_model}, {self.cores} cores, {self.memory_gib:.1f} GiB memory; "
            f"disk: {self.disk}; kernel {self.kernel}; Python {self.python}; "
            f"load average {self.load_average}"
        )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def describe_machine(work_dir: Path | None = None) -> Machine:
    """The machine this process runs on; the disk is the one holding ``work_dir`` (by default
    the temporary directory, where the benchmarks write)."""
    directory = work_dir or Path(tempfile.gettempdir())
    return Machine(
        cpu_model=_cpu_model(),
        cores=len(os.sched_getaffinity(0)),
        memory_gib=_memory_kib() / (1 << 20),
        disk=_disk(directory),
        kernel=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        load_average=" ".join(f"{v:.2f}" for v in os.getloadavg()),
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        return platform.processor() or UNKNOWN
    return platform.processor() or UNKNOWN


def _memory_kib() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def _mount_of(directory: Path) -> tuple[str, str, str]:
    """(mount point, device, file system type) of the mount holding ``directory``."""
    best = ("/", UNKNOWN, UNKNOWN)
    target = str(directory.resolve())
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        fields = line.split()
        mount_point = fields[4]
        after = fields[fields.index("-") + 1 :]
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best[0]):
            best = (mount_point, after[1], after[0])
    return best


def _block_device(device: str) -> str:
    """Model and kind (SSD, rotating) of the disk behind a device such as /dev/vda1."""
    name = Path(device).name
    sys_block = Path("/sys/class/block") / name
    if not sys_block.exists():
        return ""
    disk = sys_block.resolve()
    if (disk / "partition").exists():
        disk = disk.parent
    parts = []
    model = disk / "device" / "model"
    if model.exists():
        parts.append(" ".join(model.read_text().split()))
    rotational = disk / "queue" / "rotational"
    if rotational.exists():
        flag = rotational.read_text().strip()
        parts.append("rotational per /sys" if flag == "1" else "non-rotational per /sys")
    return ", ".join(p for p in parts if p)


def _disk(directory: Path) -> str:
    mount_point, device, fs_type = _mount_of(directory)
    try:
        size = f"{shutil.disk_usage(directory).total / 1e9:,.0f} GB"
    except OSError:
        size = UNKNOWN
    kind = _block_device(device)
    return f"{device} ({fs_type}, {size}{', ' + kind if kind else ''}) at {mount_point}"
