"""tests/ci_times.py: the stage record `make test` keeps and the table it prints at the end."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import ci_times  # noqa: E402


def test_run_passes_the_exit_status_through_and_records_the_stage(tmp_path: Path) -> None:
    record = tmp_path / "times.jsonl"
    assert ci_times.cmd_start(record) == 0
    assert ci_times.cmd_run(record, "ok-stage", [sys.executable, "-c", "pass"]) == 0
    assert ci_times.cmd_run(record, "bad-stage", [sys.executable, "-c", "raise SystemExit(3)"]) == 3
    assert ci_times.cmd_run(record, "missing", ["/nonexistent/command"]) == 127
    stages = [entry for entry in ci_times.read(record) if entry["kind"] == "stage"]
    assert [(stage["name"], stage["rc"]) for stage in stages] == [("ok-stage", 0), ("bad-stage", 3), ("missing", 127)]
    assert all(stage["end"] >= stage["start"] for stage in stages)


def test_summary_orders_by_start_and_names_the_failed_stages() -> None:
    entries = [
        {"kind": "mark", "name": "start", "start": 100.0},
        {"kind": "stage", "name": "lane1", "start": 160.0, "end": 1960.0, "rc": 0},
        {"kind": "stage", "name": "lint", "start": 101.0, "end": 641.0, "rc": 2},
    ]
    summary = ci_times.summarise(entries)
    assert [stage["name"] for stage in summary["stages"]] == ["lint", "lane1"]
    assert summary["stages"][1] == {"name": "lane1", "offset_seconds": 60.0, "wall_seconds": 1800.0, "rc": 0,
                                    "cpu_seconds": None}
    assert summary["wall_seconds"] == 1860.0
    assert summary["failed"] == ["lint"]
    text = ci_times.render(summary)
    assert "lane1" in text and "30:00" in text and "FAILED (exit 2)" in text and "31:00 (1860 s), failed: lint" in text


def test_the_command_line_writes_the_json_report(tmp_path: Path) -> None:
    env = {"GPU_CI_TIMES": str(tmp_path / "t.jsonl"), "PATH": "/usr/bin:/bin"}
    script = str(ROOT / "tests" / "ci_times.py")
    subprocess.run([sys.executable, script, "start"], env=env, check=True)
    done = subprocess.run([sys.executable, script, "run", "echo", "--", "echo", "hello"], env=env, check=True,
                          capture_output=True, text=True)
    assert done.stdout == "hello\n"
    report = subprocess.run([sys.executable, script, "report"], env=env, check=True, capture_output=True, text=True)
    assert "echo" in report.stdout and "passed" in report.stdout
    summary = json.loads((tmp_path / "t.json").read_text(encoding="utf-8"))
    assert [stage["name"] for stage in summary["stages"]] == ["echo"] and summary["failed"] == []


def test_a_stage_is_charged_the_cpu_its_processes_used_and_not_a_sleepers(tmp_path: Path) -> None:
    record = tmp_path / "times.jsonl"
    ci_times.cmd_start(record)
    burn = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
    # The grandchild's CPU counts too: the stage's command is often make or a shell that starts the real work.
    ci_times.cmd_run(record, "burn", ["sh", "-c", f"{sys.executable} -c '{burn}'"])
    ci_times.cmd_run(record, "sleep", [sys.executable, "-c", "import time; time.sleep(0.5)"])
    stages = {entry["name"]: entry for entry in ci_times.read(record) if entry["kind"] == "stage"}
    assert stages["burn"]["cpu_seconds"] >= 0.4
    assert stages["sleep"]["cpu_seconds"] < 0.3


def test_the_machines_busy_share_comes_from_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  300 0 100 500 100 0 0 0 0 0\ncpu0 150 0 50 250 50 0 0 0 0 0\n", encoding="utf-8")
    first = ci_times.machine_cpu(stat)
    hertz = first["all"] / 1000
    assert first["busy"] == 400 * hertz / 1 and first["all"] == 1000 * hertz
    stat.write_text("cpu  1000 0 200 600 200 0 0 0 0 0\n", encoding="utf-8")
    last = ci_times.machine_cpu(stat)
    (tmp_path / "junk").write_text("intr 1 2 3\n", encoding="utf-8")
    assert ci_times.machine_cpu(tmp_path / "junk") is None and ci_times.machine_cpu(tmp_path / "absent") is None
    entries = [{"kind": "mark", "name": "start", "start": 0.0, "cpu": first},
               {"kind": "stage", "name": "lane1", "start": 1.0, "end": 11.0, "rc": 0, "cpu_seconds": 65.0},
               {"kind": "mark", "name": "end", "start": 12.0, "cpu": last}]
    summary = ci_times.summarise(entries)
    # 800 busy ticks of 1000: 80 %.
    assert summary["machine"]["busy_share"] == 0.8
    assert summary["wall_seconds"] == 11.0
    text = ci_times.render(summary)
    assert "1:05" in text and "80% of its" in text


def test_the_cpu_table_puts_the_costliest_file_first_with_its_share() -> None:
    lines = ci_times.cpu_by_file_lines({"tests/integration/test_a.py": 30.0, "tests/integration/test_b.py": 90.0})
    assert lines[0].split() == ["90.0", "75%", "tests/integration/test_b.py"]
    assert lines[1].split() == ["30.0", "25%", "tests/integration/test_a.py"]
    assert lines[-1].split()[:2] == ["120.0", "100%"]
    before = ci_times.process_cpu()
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    assert ci_times.process_cpu() - before >= 0.15


def _acct(pid: int, ppid: int, command: str, hundredths: int) -> bytes:
    """One struct acct_v3 record as the kernel writes it (version 3; utime in comp_t, stime 0)."""
    mantissa, exponent = hundredths, 0
    while mantissa > 0x1FFF:  # comp_t: 13-bit mantissa, base-8 exponent
        mantissa, exponent = mantissa >> 3, exponent + 1
    return ci_times.ACCT_V3.pack(0, 3, 0, 0, 0, 0, pid, ppid, 0, 0.0, (exponent << 13) | mantissa, 0, 0, 0, 0, 0, 0,
                                 0, command.encode())


def test_cpu_by_command_resolves_each_parent_by_the_next_process_of_its_pid_to_exit() -> None:
    # Two workers of one ansible-playbook (pid 10), then pid 10 ends; pid 10 is reused by a dpkg whose child
    # dpkg-deb runs 1000.5 s (a comp_t with an exponent); a record of another version is skipped.
    data = b"".join([_acct(11, 10, "ansible-playboo", 150), _acct(12, 10, "ansible-playboo", 50),
                     _acct(10, 1, "ansible-playboo", 300), _acct(13, 10, "dpkg-deb", 100050),
                     _acct(10, 1, "dpkg", 20)])
    data += ci_times.ACCT_V3.pack(0, 2, 0, 0, 0, 0, 99, 1, 0, 0.0, 500, 0, 0, 0, 0, 0, 0, 0, b"old")
    records = ci_times.read_accounting(data)
    assert [(pid, command) for pid, _, command, _ in records] == [
        (11, "ansible-playboo"), (12, "ansible-playboo"), (10, "ansible-playboo"), (13, "dpkg-deb"), (10, "dpkg")]
    assert records[3][3] == 1000.32  # 100050 hundredths lose their low bits to the 13-bit mantissa, as the kernel's do
    groups = ci_times.command_groups(records)
    assert groups["processes"] == 5 and groups["cpu_seconds"] == 1005.5
    assert groups["top"] == [
        {"command": "dpkg-deb", "parent": "dpkg", "cpu_seconds": 1000.3, "processes": 1},
        {"command": "ansible-playboo", "parent": "?", "cpu_seconds": 3.0, "processes": 1},
        {"command": "ansible-playboo", "parent": "ansible-playboo", "cpu_seconds": 2.0, "processes": 2},
        {"command": "dpkg", "parent": "?", "cpu_seconds": 0.2, "processes": 1}]
    assert "dpkg-deb <- dpkg" in ci_times.render_commands(groups)


def test_a_refused_accounting_is_said_and_the_table_still_printed(tmp_path: Path, monkeypatch, capsys) -> None:
    record = tmp_path / "times.jsonl"
    calls = []
    monkeypatch.setattr(ci_times, "set_accounting", lambda target: calls.append(target) or "Operation not permitted")
    assert ci_times.cmd_start(record, accounting=True) == 0
    assert ci_times.cmd_report(record) == 0
    assert calls == [(tmp_path / "ci.pacct").resolve()]  # refused at start: nothing to turn off at the end
    assert "(no CPU by command: process accounting Operation not permitted)" in capsys.readouterr().out
    # Without --accounting nothing asks the kernel at all (a unit test must never move CI's own accounting file).
    calls.clear()
    assert ci_times.cmd_start(record) == 0 and ci_times.cmd_report(record) == 0 and calls == []
