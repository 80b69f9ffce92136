"""Benchmark: per Molecule scenario, the first converge time and the no-op re-run time (median of several runs).

A measurement, not a test: it prints figures and fails only if a run fails. Usage:
    .venv/bin/python bench/converge_times.py [--reruns 3] [scenario ...]
Each scenario gets a fresh host (create, prepare), one timed converge, N timed no-op converges, then destroy.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SCENARIOS = ["nvidia_driver_debian12", "nvidia_driver_debian13", "nvidia_driver_mirror", "cuda_toolkit_debian12",
                     "cuda_toolkit_mirror", "nvidia_container_toolkit_debian12", "nvidia_container_toolkit_debian13"]


def molecule(action: str, scenario: str) -> float:
    started = time.monotonic()
    result = subprocess.run(["molecule", action, "-s", scenario], cwd=ROOT, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
        raise SystemExit(f"molecule {action} -s {scenario} failed (rc={result.returncode})")
    return time.monotonic() - started


def bench(scenario: str, reruns: int) -> tuple[float, float, list[float]]:
    molecule("destroy", scenario)
    molecule("create", scenario)
    molecule("prepare", scenario)
    try:
        first = molecule("converge", scenario)
        again = [molecule("converge", scenario) for _ in range(reruns)]
    finally:
        molecule("destroy", scenario)
    return first, statistics.median(again), again


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", default=DEFAULT_SCENARIOS)
    parser.add_argument("--reruns", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for scenario in args.scenarios:
        print(f"--> {scenario}: create, prepare, converge, {args.reruns} no-op re-runs ...", flush=True)
        first, median, again = bench(scenario, args.reruns)
        rows.append((scenario, first, median, again))
        print(f"<-- {scenario}: converge {first:.1f} s, no-op re-run median {median:.1f} s", flush=True)
    print(f"\n{'scenario':<26} {'converge (s)':>13} {'no-op re-run median (s)':>24}  runs")
    for scenario, first, median, again in rows:
        print(f"{scenario:<26} {first:>13.1f} {median:>24.1f}  {', '.join(f'{t:.1f}' for t in again)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
