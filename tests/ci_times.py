#!/usr/bin/env python3
"""Wall time of each stage and lane of `make test`, recorded as they run and printed at the end. Test tooling.

`make test` wraps every stage's command: `python3 tests/ci_times.py run NAME -- COMMAND...` runs COMMAND, passes its
output and exit status through, and appends one JSON line (name, start, end, exit status, CPU seconds) to the record
($GPU_CI_TIMES, default reports/ci-times.jsonl). `start` empties the record at the beginning of a run and notes the
machine's CPU counters; `report` prints the table (each stage's start offset from the first record, its wall time,
its CPU seconds and its exit status, then the run's whole wall time and how busy the machine's cores were) and writes
it as JSON beside the record (reports/ci-times.json), for closing notes and for programs.

A stage's CPU seconds are its processes' user and system time as the kernel accounts them to the waiting parent
(getrusage of the children): daemons that outlive their starter (a lab's API server, the podman containers' own
processes) are not in any stage's figure, but they are in the machine's busy share, read from /proc/stat.

Where the kernel allows it (root: CI runs as root), `start --accounting` also turns on the kernel's process accounting (acct(2),
into reports/ci.pacct) and `report` turns it off and adds a table of CPU seconds by command and parent command over
every process that ended during the run, containers' included: what a cut of the run's CPU should go after (Ansible's
task workers, module interpreters, dpkg in the Molecule containers, the labs' API servers).

Standard library only: it runs before the project's virtualenv exists.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import resource
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

RECORD_ENV = "GPU_CI_TIMES"
DEFAULT_RECORD = Path("reports") / "ci-times.jsonl"
# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime, etime (float), utime,
# stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm[16]. 64 bytes, one per process as it exits.
ACCT_V3 = struct.Struct("<BBHIIIIIIf8H16s")
ACCT_HZ = 100  # AHZ: acct_v3's times are in hundredths of a second
TOP_COMMANDS = 15


def record_path() -> Path:
    return Path(os.environ.get(RECORD_ENV) or DEFAULT_RECORD)


def append(path: Path, entry: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # One write of one line in append mode: lanes running side by side never interleave within a line.
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry, sort_keys=True) + "\n")


def read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            entries.append(json.loads(line))
    return entries


def format_seconds(seconds: float) -> str:
    seconds = int(round(seconds))
    minutes, rest = divmod(seconds, 60)
    return f"{minutes}:{rest:02d}" if minutes else f"{rest}s"


def summarise(entries: Sequence[dict]) -> dict:
    """The table as data: stages in the order they started, each with offset, wall and exit status."""
    marks = {entry["name"]: entry for entry in entries if entry.get("kind") == "mark"}
    stages = sorted((entry for entry in entries if entry.get("kind") == "stage"), key=lambda entry: entry["start"])
    # The run's span: from its start mark to the last stage's end (the end mark is the report's own time).
    timed = stages + ([marks["start"]] if "start" in marks else [])
    origin = min([entry["start"] for entry in timed] or [0.0])
    end = max([entry.get("end", entry["start"]) for entry in timed] or [0.0])
    summary = {
        "started": marks["start"]["start"] if "start" in marks else origin,
        "wall_seconds": round(end - origin, 1),
        "failed": [stage["name"] for stage in stages if stage["rc"] != 0],
        "stages": [{"name": stage["name"], "offset_seconds": round(stage["start"] - origin, 1),
                    "wall_seconds": round(stage["end"] - stage["start"], 1), "rc": stage["rc"],
                    "cpu_seconds": stage.get("cpu_seconds")} for stage in stages],
    }
    first, last = (marks.get(name, {}).get("cpu") for name in ("start", "end"))
    if first and last and last["all"] > first["all"]:
        busy = last["busy"] - first["busy"]
        summary["machine"] = {"cores": last["cores"], "busy_cpu_seconds": round(busy, 1),
                              "busy_share": round(busy / (last["all"] - first["all"]), 3)}
    return summary


def render(summary: dict) -> str:
    width = max([len(stage["name"]) for stage in summary["stages"]] + [5])
    lines = ["==> make test: wall time of each stage and lane (tests/ci_times.py; JSON in reports/ci-times.json)",
             f"    {'stage':<{width}}  {'start':>7}  {'wall':>7}  {'cpu':>7}  result"]
    for stage in summary["stages"]:
        result = "ok" if stage["rc"] == 0 else f"FAILED (exit {stage['rc']})"
        cpu = stage.get("cpu_seconds")
        lines.append(f"    {stage['name']:<{width}}  {format_seconds(stage['offset_seconds']):>7}  "
                     f"{format_seconds(stage['wall_seconds']):>7}  {'-' if cpu is None else format_seconds(cpu):>7}  "
                     f"{result}")
    verdict = "passed" if not summary["failed"] else f"failed: {', '.join(summary['failed'])}"
    lines.append(f"    whole run: {format_seconds(summary['wall_seconds'])} ({summary['wall_seconds']:.0f} s), {verdict}")
    machine = summary.get("machine")
    if machine:
        lines.append(f"    machine: {machine['busy_share']:.0%} of its {machine['cores']} cores busy over the run "
                     f"({machine['busy_cpu_seconds']:.0f} CPU seconds, daemons and containers included)")
    return "\n".join(lines)


def machine_cpu(stat: Path = Path("/proc/stat")) -> dict | None:
    """The machine's CPU counters in seconds since boot: busy (everything but idle and iowait) and all, over every
    core; None where /proc/stat cannot be read."""
    try:
        fields = stat.read_text(encoding="utf-8").splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if fields[:1] != ["cpu"]:
        return None
    ticks = [int(value) for value in fields[1:9]]  # user nice system idle iowait irq softirq steal
    hertz = os.sysconf("SC_CLK_TCK")
    return {"busy": (sum(ticks) - ticks[3] - ticks[4]) / hertz, "all": sum(ticks) / hertz, "cores": os.cpu_count()}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu() -> float:
    """CPU seconds of this process and of every child it has waited for (a test's ansible-playbook runs, say)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def cpu_by_file_lines(by_file: dict[str, float]) -> list[str]:
    """The integration lanes' closing table: CPU seconds per test file, the costliest first, with the total."""
    total = sum(by_file.values())
    lines = [f"{seconds:8.1f}  {seconds / total if total else 0:4.0%}  {path}"
             for path, seconds in sorted(by_file.items(), key=lambda item: (-item[1], item[0]))]
    return lines + [f"{total:8.1f}  100%  (all files)"]


def accounting_path(path: Path) -> Path:
    return path.with_name("ci.pacct")


def set_accounting(target: Path | None) -> str | None:
    """Turn the kernel's process accounting on into target, or off (None); the reason when the kernel refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if target is not None:
            target.write_bytes(b"")
        if libc.acct(str(target).encode() if target is not None else None) != 0:
            return os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as exc:
        return str(exc)
    return None


def comp_t(value: int) -> int:
    """acct's comp_t: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * ((value >> 13) & 7))


def read_accounting(data: bytes) -> list[tuple[int, int, str, float]]:
    """(pid, ppid, command, CPU seconds) of each acct_v3 record, in the order the processes exited."""
    records = []
    for offset in range(0, len(data) - ACCT_V3.size + 1, ACCT_V3.size):
        fields = ACCT_V3.unpack_from(data, offset)
        if fields[1] & 0x7F != 3:
            continue
        command = fields[-1].split(b"\0", 1)[0].decode("utf-8", "replace")
        records.append((fields[6], fields[7], command, (comp_t(fields[10]) + comp_t(fields[11])) / ACCT_HZ))
    return records


def command_groups(records: Sequence[tuple[int, int, str, float]], top: int = TOP_COMMANDS) -> dict:
    """CPU seconds by (command, parent command), the costliest first. A parent is the first process with the parent's
    pid to exit after the child (pids are reused over a long run; a parent outlives its children)."""
    parent_of: list[str] = [""] * len(records)
    later: dict[int, str] = {}
    for index in range(len(records) - 1, -1, -1):
        pid, ppid, command, _ = records[index]
        parent_of[index] = later.get(ppid, "?")
        later[pid] = command
    seconds: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for (_, _, command, cpu), parent in zip(records, parent_of):
        seconds[(command, parent)] += cpu
        counts[(command, parent)] += 1
    return {"processes": len(records), "cpu_seconds": round(sum(seconds.values()), 1),
            "top": [{"command": command, "parent": parent, "cpu_seconds": round(cpu, 1),
                     "processes": counts[(command, parent)]}
                    for (command, parent), cpu in seconds.most_common(top)]}


def render_commands(groups: dict) -> str:
    lines = [f"==> CPU seconds by command (process accounting: {groups['processes']} processes that ended during the "
             f"run, {groups['cpu_seconds']:.0f} CPU seconds)"]
    total = groups["cpu_seconds"] or 1
    for entry in groups["top"]:
        lines.append(f"    {entry['cpu_seconds']:8.1f}  {entry['cpu_seconds'] / total:4.0%}  {entry['processes']:7d}  "
                     f"{entry['command']} <- {entry['parent']}")
    return "\n".join(lines)


def cmd_start(path: Path, accounting: bool = False) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("", encoding="utf-8")
    mark = {"kind": "mark", "name": "start", "start": time.time(), "cpu": machine_cpu()}
    if accounting:  # one accounting file per machine: only `make test` itself asks, never a test of this script
        mark["accounting"] = set_accounting(accounting_path(path).resolve()) or "on"
    append(path, mark)
    return 0


def cmd_run(path: Path, name: str, command: Sequence[str]) -> int:
    if not command:
        print("ci_times.py run: no command given after --", file=sys.stderr)
        return 2
    start, cpu = time.time(), children_cpu()
    try:
        rc = subprocess.call(list(command))
    except OSError as exc:
        print(f"ci_times.py run {name}: {exc}", file=sys.stderr)
        rc = 127
    except KeyboardInterrupt:
        rc = 130
    append(path, {"kind": "stage", "name": name, "start": start, "end": time.time(), "rc": rc,
                  "cpu_seconds": round(children_cpu() - cpu, 1)})
    return rc


def cmd_report(path: Path) -> int:
    entries = read(path)
    started = next((entry for entry in entries if entry.get("name") == "start"), {})
    if started.get("accounting") == "on":
        set_accounting(None)
    append(path, {"kind": "mark", "name": "end", "start": time.time(), "cpu": machine_cpu()})
    summary = summarise(read(path))
    pacct = accounting_path(path)
    if started.get("accounting") == "on" and pacct.exists():
        summary["commands"] = command_groups(read_accounting(pacct.read_bytes()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(render(summary))
    if "commands" in summary:
        print(render_commands(summary["commands"]))
    elif started.get("accounting"):
        print(f"    (no CPU by command: process accounting {started['accounting']})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="empty the record (the beginning of a run)")
    start.add_argument("--accounting", action="store_true",
                       help="also turn on the kernel's process accounting (reports/ci.pacct) until `report`")
    run = sub.add_parser("run", help="run a stage's command and record its wall time")
    run.add_argument("name")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    sub.add_parser("report", help="print the table and write reports/ci-times.json")
    args = parser.parse_args(argv)
    path = record_path()
    if args.command == "start":
        return cmd_start(path, args.accounting)
    if args.command == "run":
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        return cmd_run(path, args.name, command)
    return cmd_report(path)


if __name__ == "__main__":
    sys.exit(main())
