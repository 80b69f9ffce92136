"""The drift schedule on a systemd control host (the execution environment image booted with systemd).

The timer is installed and enabled with the inventory's calendar, delay, Persistent= and timeout; starting its
service runs the collection's own runner (ansible-runner over gpu_ops.cluster.drift) and leaves a report and
metrics; a second run while one holds the runner's lock does nothing and does not fail the unit; bad settings are
refused in preflight, naming the variable, with the installed units unchanged.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "molecule"))

from playbook_run import flat_output, run_playbook  # noqa: E402

UNIT = "gpu-ops-drift"
REPORTS = "/var/lib/gpu-ops/drift"
METRICS = "/var/lib/node-exporter/textfile/gpu_drift.prom"
CONVERGE = Path(os.environ.get("MOLECULE_SCENARIO_DIRECTORY", Path(__file__).resolve().parents[1])) / "converge.yml"


def show(host, unit: str, *properties: str) -> dict:
    out = host.check_output(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in properties))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def units(host) -> dict:
    return {name: host.file(f"/etc/systemd/system/{UNIT}.{name}").content_string for name in ("service", "timer")}


def test_units_pass_systemd_analyze_verify(host):
    result = host.run(f"systemd-analyze verify /etc/systemd/system/{UNIT}.service /etc/systemd/system/{UNIT}.timer")
    assert result.rc == 0, result.stderr


def test_timer_is_enabled_active_and_scheduled_as_the_inventory_says(host):
    timer = show(host, f"{UNIT}.timer", "ActiveState", "UnitFileState", "Persistent", "RandomizedDelayUSec",
                 "TimersCalendar", "Unit")
    assert timer["ActiveState"] == "active" and timer["UnitFileState"] == "enabled", timer
    assert timer["Persistent"] == "yes" and timer["RandomizedDelayUSec"] == "5min", timer
    assert "03:17:00" in timer["TimersCalendar"] and timer["Unit"] == f"{UNIT}.service", timer
    assert f"{UNIT}.timer" in host.check_output(f"systemctl list-timers --all {UNIT}.timer")


def test_service_runs_the_collection_runner_with_one_command_line(host):
    service = show(host, f"{UNIT}.service", "TimeoutStartUSec", "SuccessExitStatus", "ExecStart", "WorkingDirectory",
                   "Environment", "Type")
    assert service["Type"] == "oneshot" and service["TimeoutStartUSec"] == "20min", service
    assert set(service["SuccessExitStatus"].split()) >= {"2", "3", "4"}, service
    assert service["WorkingDirectory"] == "/etc/gpu-ops" and "ANSIBLE_CONFIG=/etc/gpu-ops/ansible.cfg" in service[
        "Environment"], service
    argv = service["ExecStart"]
    for word in ("/usr/bin/python3", "gpu_ops/cluster/runner/gpu_ops_drift.py", "check", "-i /etc/gpu-ops/inventory",
                 f"--reports {REPORTS}", f"--metrics-file {METRICS}", "--timeout 600"):
        assert word in argv, (word, argv)
    assert "--detect-only" not in argv


@pytest.fixture(scope="module")
def first_run(host) -> dict:
    """The service started as the timer starts it: a real drift run."""
    host.run(f"rm -f {REPORTS}/latest.json {METRICS}")
    started = host.run(f"timeout 900 systemctl start {UNIT}.service")
    return {"rc": started.rc, "stderr": started.stderr,
            "unit": show(host, f"{UNIT}.service", "Result", "ExecMainStatus"),
            "journal": host.check_output(f"journalctl -u {UNIT}.service --no-pager -n 60")}


def test_a_scheduled_run_reports_in_sync_with_metrics(host, first_run):
    assert first_run["rc"] == 0, first_run
    assert first_run["unit"] == {"Result": "success", "ExecMainStatus": "0"}, first_run
    report = json.loads(host.file(f"{REPORTS}/latest.json").content_string)
    assert report["result"] == "in_sync" and report["exit_code"] == 0, report
    assert report["hosts"] == ["localhost"] and report["items"] == [], report
    assert [run["name"] for run in report["runs"]] == ["check"], report["runs"]
    assert (host.file(f"{REPORTS}/{report['ident']}/drift.txt").exists)
    metrics = host.file(METRICS).content_string
    assert 'gpu_drift_last_run_result{result="in_sync"} 1' in metrics, metrics
    assert "gpu_drift_last_success_timestamp_seconds" in metrics, metrics
    # Written atomically: no temporary file left beside it for node_exporter to read half-written.
    assert host.check_output("ls -A /var/lib/node-exporter/textfile").split() == ["gpu_drift.prom"]


def test_a_run_while_another_holds_the_lock_does_nothing_and_does_not_fail_the_unit(host, first_run):
    before = host.check_output(f"ls {REPORTS}")
    held = host.run(f"flock {REPORTS}/drift.lock timeout 900 systemctl start {UNIT}.service")
    assert held.rc == 0, held.stderr
    assert show(host, f"{UNIT}.service", "Result", "ExecMainStatus") == {"Result": "success", "ExecMainStatus": "4"}
    assert "this run did nothing" in host.check_output(f"journalctl -u {UNIT}.service --no-pager -n 20")
    assert host.check_output(f"ls {REPORTS}") == before


@pytest.mark.parametrize("extra_vars, message", [
    ({"drift_schedule_on_calendar": "every tuesday"},
     'drift_schedule_on_calendar="every tuesday"; allowed: what `systemd-analyze calendar` accepts'),
    ({"drift_schedule_timeout": "soon"}, 'drift_schedule_timeout="soon"; allowed: what `systemd-analyze timespan`'),
    ({"drift_schedule_python": "/usr/bin/python9"}, 'drift_schedule_python="/usr/bin/python9": no file there'),
    ({"drift_schedule_inventories": ["/etc/gpu-ops/nothing"]},
     'drift_schedule_inventories[0]="/etc/gpu-ops/nothing": no file or directory there'),
    # The argument spec's choices judge it first, in Ansible's own words.
    ({"drift_schedule_method": "cron"}, "value of drift_schedule_method must be one of: systemd, cronjob, got: cron"),
    ({"drift_schedule_detect_only": "false"}, 'drift_schedule_detect_only="false" is not a boolean (str)'),
    ({"drift_schedule_user": "nobody-here"}, "drift_schedule_user=nobody-here: no such user"),
    ({"drift_schedule_environment": {"1BAD": "x"}}, "drift_schedule_environment key '1BAD'"),
], ids=["calendar", "timespan", "python", "inventory", "method", "quoted-bool", "user", "env-name"])
def test_bad_settings_are_refused_before_anything_changes(host, extra_vars, message):
    before = units(host)
    result = run_playbook(CONVERGE, extra_vars)
    output = flat_output(result)
    assert result.returncode != 0, output[-2000:]
    assert message in output, output[-3000:]
    assert units(host) == before
