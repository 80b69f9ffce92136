"""Run Molecule scenarios, several at a time, and report each one's result and time.

Scenarios have their own containers and names, so they can run concurrently, with one exception: scenarios that mount
the same apt archive cache into their hosts would fight over apt's lock on it, so they form one lane and run one
after another. Lanes run in parallel. Each scenario's full output goes to .cache/molecule-logs/<scenario>.log, and a
failed scenario's log tail is printed at the end.
"""

from __future__ import annotations

import argparse
import re
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


APT_ARCHIVES_MOUNT = re.compile(r"^\s*-\s*(\S+):/var/cache/apt/archives(:\S*)?\s*$", re.MULTILINE)


def apt_cache_of(scenario: str) -> str:
    """The host path a scenario mounts as its hosts' apt archive cache ('' for none)."""
    text = (ROOT / "molecule" / scenario / "molecule.yml").read_text(encoding="utf-8")
    match = APT_ARCHIVES_MOUNT.search(text)
    return match.group(1) if match else ""


def lanes(scenarios: list[str]) -> list[list[str]]:
    """Group scenarios that share an apt archive cache; the others run alone. Longest lanes first."""
    grouped: dict[str, list[str]] = {}
    for scenario in scenarios:
        cache = apt_cache_of(scenario)
        grouped.setdefault(cache or f"own:{scenario}", []).append(scenario)
    return sorted(grouped.values(), key=len, reverse=True)


ANSI = re.compile(r"\x1b\[[0-9;]*m|\x1b\]8;;[^\x1b]*\x1b\\")


def failure_excerpt(log_path: Path, lines: int = 80) -> str:
    """The lines leading up to the first failed Molecule action (not the clean-up after it), without colours."""
    text = ANSI.sub("", log_path.read_text(encoding="utf-8", errors="replace")).splitlines()
    failed_at = next((i for i, line in enumerate(text) if "Executed: Failed" in line), len(text))
    return "\n".join(text[max(0, failed_at - lines):failed_at + 1])


def run_lane(lane: list[str]) -> list[tuple[str, int, float]]:
    return [run_scenario(name) for name in lane]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scenarios", nargs="+")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    LOGS.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = [result for lane in pool.map(run_lane, lanes(args.scenarios)) for result in lane]
    failed = [name for name, rc, _ in results if rc != 0]
    for name in failed:
        print(f"\n===== {name}: the log before the failed action =====\n" + failure_excerpt(LOGS / f"{name}.log"))
    print("\nScenario times: " + ", ".join(f"{name} {elapsed:.0f} s" for name, _, elapsed in results))
    print(f"molecule: {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
