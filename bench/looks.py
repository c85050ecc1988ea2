"""How long does a look at a pipeline take: ``lowmark status``, ``plan``, ``show``, ``sql``,
``list`` and a ``run`` with nothing to do?

Each command runs ``--runs`` times in a new process (the ``lowmark`` script beside this
Python), over the demo's data root (made once with ``lowmark demo`` unless ``--data-root``
names one that has it); it prints, per command, the median wall time and the median CPU time
(user + system) of the process. CPU time is what to compare on a shared machine: the wall
time grows with the machine's load, which the output states before and after.

Which code runs is the interpreter's: ``PYTHONPATH=<a checkout>`` times that checkout.

    .venv/bin/python -m bench.looks                         # make bench
    .venv/bin/python -m bench.looks --data-root /tmp/looks/data --runs 3
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOOKS = {
    "status orders": ["status", "orders"],
    "status user_revenue": ["status", "user_revenue"],
    "plan orders": ["plan", "orders"],
    "plan user_revenue": ["plan", "user_revenue"],
    "show orders": ["show", "orders"],
    "sql": ["sql", "SELECT count(*) AS n FROM orders.sink"],
    "list": ["list"],
    "run orders, caught up": ["run", "orders"],
    "run user_revenue, caught up": ["run", "user_revenue"],
}
"""Each look, by name: its arguments after ``lowmark --data-root DATA_ROOT``."""


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one ``lowmark ARGV`` in a new process; raises if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="Runs of each command.")
    parser.add_argument(
        "--data-root", type=Path, help="A data root `lowmark demo` ran in (default: a new one)."
    )
    args = parser.parse_args()
    lowmark = str(Path(sys.executable).parent / "lowmark")
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}  # no reporting
    with tempfile.TemporaryDirectory(prefix="looks-") as made:
        root = args.data_root or Path(made)
        if args.data_root is None:
            print(f"lowmark demo in {root} (Spark: ~30 s)…", flush=True)
            demo = [lowmark, "--data-root", str(root), "demo"]
            subprocess.run(demo, env=env, stdout=subprocess.DEVNULL, check=True)
        print(f"load average {os.getloadavg()[0]:.1f}; {args.runs} runs each, medians")
        print(f"{'command':30} {'wall s':>7} {'CPU s':>7}")
        for name, look in LOOKS.items():
            argv = [lowmark, "--data-root", str(root), *look]
            times = [timed(argv, env) for _ in range(args.runs)]
            wall = statistics.median(t[0] for t in times)
            cpu = statistics.median(t[1] for t in times)
            print(f"{name:30} {wall:7.2f} {cpu:7.2f}", flush=True)
        print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
