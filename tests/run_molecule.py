"""Run Molecule scenarios, several at a time, and report each one's result and time.

Scenarios are independent (own containers, own names), so they run concurrently; each one's full output goes to
.cache/molecule-logs/<scenario>.log, and a failed scenario's log tail is printed at the end.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / ".cache" / "molecule-logs"
_print_lock = threading.Lock()


def say(message: str) -> None:
    with _print_lock:
        print(message, flush=True)


def run_scenario(name: str) -> tuple[str, int, float]:
    log_path = LOGS / f"{name}.log"
    started = time.monotonic()
    say(f"--> {name}: started (log: {log_path.relative_to(ROOT)})")
    with log_path.open("w", encoding="utf-8") as log:
        rc = subprocess.call(["molecule", "test", "-s", name], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    elapsed = time.monotonic() - started
    say(f"<-- {name}: {'passed' if rc == 0 else f'FAILED (rc={rc})'} in {elapsed:.0f} s")
    return name, rc, elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scenarios", nargs="+")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    LOGS.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(run_scenario, args.scenarios))
    failed = [name for name, rc, _ in results if rc != 0]
    for name in failed:
        tail = (LOGS / f"{name}.log").read_text(encoding="utf-8", errors="replace").splitlines()[-80:]
        print(f"\n===== {name}: last lines of the log =====\n" + "\n".join(tail))
    print("\nScenario times: " + ", ".join(f"{name} {elapsed:.0f} s" for name, _, elapsed in results))
    print(f"molecule: {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
