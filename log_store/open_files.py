"""The process's limit of open descriptors, raised once at start by the gateway and the
push-client: each open partition of the embedded store holds up to 8 descriptors
(``log_store.partition_handles``), each tailed file one, and systemd and most shells leave a
soft 1024."""

from __future__ import annotations

import contextlib
import resource


def raise_open_files_limit() -> None:
    """Take the hard limit of open descriptors as the soft one (children inherit it); what
    stays below the hard limit is left to the callers' own sizing from the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
