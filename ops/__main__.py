import sys

from ops import stop_signals

stop_signals.install()  # first: a stop while the rest is imported is a clean stop

from ops.cli import main  # noqa: E402

sys.exit(main())
