"""Write a sample access log forever: numbered lines, renamed away every N lines like logrotate.

python scripts/sample_log.py PATH [--rate LINES_PER_S] [--rotate-every N]
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

PAGES = ["/", "/search", "/images", "/maps", "/news", "/weather", "/mail", "/video"]
AGENTS = ["Mozilla/5.0 (X11; Linux x86_64)", "curl/8.1", "YandexBot/3.0", "Wget/1.21"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path", type=Path)
    parser.add_argument("--rate", type=float, default=5.0)
    parser.add_argument("--rotate-every", type=int, default=50)
    args = parser.parse_args()
    args.path.parent.mkdir(parents=True, exist_ok=True)
    number = 0
    out = open(args.path, "a")  # noqa: SIM115 - reopened at every rotation
    while True:
        number += 1
        stamp = time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime())
        ip = f"10.{random.randrange(256)}.{random.randrange(256)}.{random.randrange(256)}"
        out.write(
            f'{ip} - - [{stamp}] "GET {random.choice(PAGES)} HTTP/1.1" 200 '
            f'{random.randrange(200, 90000)} "-" "{random.choice(AGENTS)}" line={number}\n'
        )
        out.flush()
        if number % args.rotate_every == 0:
            out.close()
            os.replace(args.path, f"{args.path}.1")
            out = open(args.path, "a")  # noqa: SIM115
        time.sleep(1.0 / args.rate)


if __name__ == "__main__":
    main()
