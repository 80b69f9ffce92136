"""plugins/filter/drift_schedule.py: the drift_schedule role's preflight checks and the runner's command line, which
every schedule (systemd timer, CronJob) shares. The role's defaults are read from its own files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT, load_filter_plugin

drift = load_filter_plugin("drift_schedule")
DEFAULTS = yaml.safe_load((REPO_ROOT / "roles" / "drift_schedule" / "defaults" / "main.yml").read_text())


def settings(**changes):
    """The role's defaults with the Jinja ones resolved as on a control host, then the changes."""
    values = {**DEFAULTS, "drift_schedule_inventories": ["/etc/gpu-ops/inventory"],
              "drift_schedule_python": "/opt/venv/bin/python", "drift_schedule_runner": "/opt/gpu-ops/runner/gpu_ops_drift.py",
              "drift_schedule_working_directory": "/etc/gpu-ops", "drift_schedule_ansible_config": ""}
    values.update(changes)
    return values


@pytest.mark.parametrize("method", ["systemd", "cronjob"])
def test_the_defaults_have_no_problem(method):
    assert drift.drift_schedule_problems(settings(drift_schedule_method=method)) == []


@pytest.mark.parametrize(("changes", "expected"), [
    ({"drift_schedule_method": "cron"}, "drift_schedule_method='cron'; allowed: systemd, cronjob"),
    ({"drift_schedule_inventories": []}, "drift_schedule_inventories=[]; allowed: a list of one or more"),
    ({"drift_schedule_inventories": ["/a", "relative/b"]}, "drift_schedule_inventories[1]='relative/b'; allowed: an absolute path"),
    ({"drift_schedule_reports_dir": "/"}, "drift_schedule_reports_dir='/'; allowed: an absolute directory path other than /"),
    ({"drift_schedule_metrics_file": "gpu.prom"}, "drift_schedule_metrics_file='gpu.prom'; allowed:"),
    ({"drift_schedule_run_timeout": "600"}, "drift_schedule_run_timeout='600'; allowed: an integer number of seconds"),
    ({"drift_schedule_run_timeout": 30}, "drift_schedule_run_timeout=30; allowed: an integer number of seconds, at least 60"),
    ({"drift_schedule_unit_name": "drift.service"}, "drift_schedule_unit_name='drift.service'; allowed: a systemd unit name"),
    ({"drift_schedule_user": "Root User"}, "drift_schedule_user='Root User'; allowed: a user name"),
    ({"drift_schedule_python": "python3"}, "drift_schedule_python='python3'; allowed: an absolute path"),
    ({"drift_schedule_environment": {"KUBECONFIG": "a\nb"}}, "drift_schedule_environment.KUBECONFIG='a\\nb'; allowed: a one-line"),
    ({"drift_schedule_environment": {"9X": "1"}}, "drift_schedule_environment key '9X'"),
])
def test_systemd_settings_are_refused_by_name(changes, expected):
    problems = drift.drift_schedule_problems(settings(**changes))
    assert any(problem.startswith(expected) for problem in problems), problems


@pytest.mark.parametrize(("changes", "expected"), [
    ({"drift_schedule_namespace": "Drift"}, "drift_schedule_namespace='Drift'; allowed: a DNS label"),
    ({"drift_schedule_schedule": "* * * *"}, "drift_schedule_schedule='* * * *'; allowed: five cron fields"),
    ({"drift_schedule_schedule": "every hour"}, "drift_schedule_schedule='every hour'"),
    ({"drift_schedule_time_zone": "UTC+1 hour"}, "drift_schedule_time_zone='UTC+1 hour'"),
    ({"drift_schedule_image": "Registry/EE"}, "drift_schedule_image='Registry/EE'; allowed: an image reference"),
    ({"drift_schedule_image_pull_policy": "always"}, "drift_schedule_image_pull_policy='always'; allowed: Always"),
    ({"drift_schedule_ssh_secret": "SSH key"}, "drift_schedule_ssh_secret='SSH key'"),
    ({"drift_schedule_reports_size": "0"}, "drift_schedule_reports_size='0'; allowed: a Kubernetes quantity above 0"),
    ({"drift_schedule_storage_class": "Fast_SSD"}, "drift_schedule_storage_class='Fast_SSD'"),
    ({"drift_schedule_secret_namespaces": "monitoring"}, "drift_schedule_secret_namespaces='monitoring'"),
])
def test_cronjob_settings_are_refused_by_name(changes, expected):
    problems = drift.drift_schedule_problems(settings(drift_schedule_method="cronjob", **changes))
    assert any(problem.startswith(expected) for problem in problems), problems


def test_systemd_settings_are_not_judged_for_a_cronjob_and_the_other_way_round():
    assert drift.drift_schedule_problems(settings(drift_schedule_method="cronjob", drift_schedule_python="python3")) == []
    assert drift.drift_schedule_problems(settings(drift_schedule_image="Bad Image")) == []


@pytest.mark.parametrize("schedule", ["17 * * * *", "*/15 0-6,20-23 * * mon-fri", "0 3 1 JAN *", "@hourly"])
def test_cron_schedules_the_cronjob_controller_takes(schedule):
    assert drift.is_cron_schedule(schedule)


@pytest.mark.parametrize("image", ["localhost/gpu-ops-ee:latest", "registry.example.com:5000/ops/gpu-ops-ee:1.2.0",
                                   "gpu-ops-ee@sha256:" + "a" * 64, "ghcr.io/org/ee:v1.0@sha256:" + "0" * 64])
def test_image_references(image):
    assert drift.is_image_reference(image)


def test_one_command_line_for_every_schedule():
    args = drift.drift_runner_args(settings(drift_schedule_metrics_file="/var/lib/node-exporter/gpu_drift.prom",
                                            drift_schedule_limit="cluster_control", drift_schedule_detect_only=True),
                                   ["/inv/a", "/inv/b"])
    assert args == ["check", "-i", "/inv/a", "-i", "/inv/b", "--reports", "/var/lib/gpu-ops/drift",
                    "--metrics-file", "/var/lib/node-exporter/gpu_drift.prom", "--limit", "cluster_control",
                    "--detect-only", "--timeout", "1800"]
    assert drift.drift_runner_args(settings(), ["/inv"]) == ["check", "-i", "/inv", "--reports", "/var/lib/gpu-ops/drift",
                                                             "--timeout", "1800"]


def test_every_flag_the_command_line_uses_is_one_the_runner_takes():
    import sys

    sys.path.insert(0, str(REPO_ROOT / "runner"))
    import gpu_ops_drift

    args = drift.drift_runner_args(settings(drift_schedule_metrics_file="/m.prom", drift_schedule_limit="x",
                                            drift_schedule_detect_only=True), ["/inv"])
    parsed = gpu_ops_drift.build_parser().parse_args(args)
    assert (parsed.command, parsed.inventories, parsed.reports, parsed.metrics_file, parsed.limit, parsed.detect_only,
            parsed.timeout) == ("check", ["/inv"], "/var/lib/gpu-ops/drift", "/m.prom", "x", True, 1800)
