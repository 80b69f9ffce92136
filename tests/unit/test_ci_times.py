"""tests/ci_times.py: the stage record `make test` keeps and the table it prints at the end."""

from __future__ import annotations

import json
import subprocess
import sys
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
    assert summary["stages"][1] == {"name": "lane1", "offset_seconds": 60.0, "wall_seconds": 1800.0, "rc": 0}
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
