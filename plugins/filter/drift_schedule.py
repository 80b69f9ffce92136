# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Checks of the drift_schedule role's inputs (roles/drift_schedule preflight) and the runner's command line it
installs. systemd calendar expressions and time spans are judged by systemd-analyze on the host, not here."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping

from ansible_collections.gpu_ops.cluster.plugins.module_utils.input_forms import (
    ROLE_NAMESPACE_ALLOWED, is_cron_schedule, is_image_reference, is_int, is_role_namespace)
from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_values import (
    is_dns_label, is_dns_subdomain, quantity_problem)

METHODS = ("systemd", "cronjob")
_UNIT = re.compile(r"^[A-Za-z0-9:_.\\-]{1,200}\Z")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\Z")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_TIME_ZONE = re.compile(r"^[A-Za-z_]+(?:/[A-Za-z0-9_+-]+)*\Z")


def drift_schedule_problems(settings: Mapping[str, Any]) -> List[str]:
    """Every problem of the drift_schedule role's settings (the role passes its public variables by name)."""
    problems: List[str] = []

    def bad(name: str, allowed: str) -> None:
        problems.append("%s=%r; allowed: %s" % (name, settings.get(name), allowed))

    method = settings.get("drift_schedule_method")
    if method not in METHODS:
        bad("drift_schedule_method", ", ".join(METHODS))
    inventories = settings.get("drift_schedule_inventories")
    if not isinstance(inventories, list) or not inventories:
        bad("drift_schedule_inventories", "a list of one or more inventory paths")
    else:
        for index, path in enumerate(inventories):
            if not isinstance(path, str) or not path.startswith("/"):
                problems.append("drift_schedule_inventories[%d]=%r; allowed: an absolute path" % (index, path))
    for name in ("drift_schedule_reports_dir",):
        value = settings.get(name)
        if not (isinstance(value, str) and value.startswith("/") and value.rstrip("/") != ""):
            bad(name, "an absolute directory path other than /")
    metrics = settings.get("drift_schedule_metrics_file")
    if metrics != "" and not (isinstance(metrics, str) and metrics.startswith("/") and not metrics.endswith("/")):
        bad("drift_schedule_metrics_file", '"" (<reports_dir>/gpu_drift.prom) or an absolute file path')
    if not isinstance(settings.get("drift_schedule_limit"), str):
        bad("drift_schedule_limit", '"" (every host) or a host pattern')
    run_timeout = settings.get("drift_schedule_run_timeout")
    if not is_int(run_timeout) or run_timeout < 60:
        bad("drift_schedule_run_timeout", "an integer number of seconds, at least 60")
    if method == "systemd":
        _systemd_problems(settings, bad, problems)
    elif method == "cronjob":
        _cronjob_problems(settings, bad)
    return problems


def _systemd_problems(settings: Mapping[str, Any], bad: Any, problems: List[str]) -> None:
    unit = settings.get("drift_schedule_unit_name")
    if not (isinstance(unit, str) and _UNIT.match(unit) and not unit.endswith((".service", ".timer"))):
        bad("drift_schedule_unit_name", "a systemd unit name without its suffix, such as gpu-ops-drift")
    if not (isinstance(settings.get("drift_schedule_user"), str) and _USER.match(settings["drift_schedule_user"])):
        bad("drift_schedule_user", "a user name such as root or gpuops")
    for name in ("drift_schedule_python", "drift_schedule_runner", "drift_schedule_working_directory"):
        value = settings.get(name)
        if not (isinstance(value, str) and value.startswith("/")):
            bad(name, "an absolute path")
    config = settings.get("drift_schedule_ansible_config")
    if config != "" and not (isinstance(config, str) and config.startswith("/")):
        bad("drift_schedule_ansible_config", '"" (none set) or the absolute path of an ansible.cfg')
    environment = settings.get("drift_schedule_environment")
    if not isinstance(environment, dict):
        bad("drift_schedule_environment", "a mapping of environment variable names to strings")
    else:
        for key, value in environment.items():
            if not (isinstance(key, str) and _ENV_NAME.match(key)):
                problems.append("drift_schedule_environment key %r; allowed: a name of letters, digits and _, "
                                "not starting with a digit" % (key,))
            elif not isinstance(value, (str, int)) or isinstance(value, bool) or "\n" in str(value):
                problems.append("drift_schedule_environment.%s=%r; allowed: a one-line string" % (key, value))


def _cronjob_problems(settings: Mapping[str, Any], bad: Any) -> None:
    # The role creates the namespace and labels it Pod Security restricted: never one of Kubernetes' own.
    if not is_role_namespace(settings.get("drift_schedule_namespace")):
        bad("drift_schedule_namespace", ROLE_NAMESPACE_ALLOWED)
    if not is_cron_schedule(settings.get("drift_schedule_schedule")):
        bad("drift_schedule_schedule", 'five cron fields such as "17 * * * *", or @hourly, @daily, ...')
    zone = settings.get("drift_schedule_time_zone")
    if zone != "" and not (isinstance(zone, str) and _TIME_ZONE.match(zone)):
        bad("drift_schedule_time_zone", '"" (the controller\'s zone) or a tz database name such as Etc/UTC')
    if not is_image_reference(settings.get("drift_schedule_image")):
        bad("drift_schedule_image", "an image reference such as registry.example.com/gpu-ops-ee:1.2.0")
    if settings.get("drift_schedule_image_pull_policy") not in ("Always", "IfNotPresent", "Never"):
        bad("drift_schedule_image_pull_policy", "Always, IfNotPresent, Never")
    ssh = settings.get("drift_schedule_ssh_secret")
    if ssh != "" and not is_dns_subdomain(ssh):
        bad("drift_schedule_ssh_secret", '"" (no SSH key: cluster classes only) or the name of a Secret')
    size = settings.get("drift_schedule_reports_size")
    if not isinstance(size, str) or quantity_problem("", size, positive=True):
        bad("drift_schedule_reports_size", "a Kubernetes quantity above 0 such as 1Gi")
    storage_class = settings.get("drift_schedule_storage_class")
    if storage_class != "" and not is_dns_subdomain(storage_class):
        bad("drift_schedule_storage_class", '"" (the cluster default) or a StorageClass name')
    namespaces = settings.get("drift_schedule_secret_namespaces")
    if not isinstance(namespaces, list) or not all(is_dns_label(n) for n in namespaces):
        bad("drift_schedule_secret_namespaces", "a list of namespace names")


def drift_runner_args(settings: Mapping[str, Any], inventories: List[str]) -> List[str]:
    """The runner's arguments (after the script): one command line for every schedule."""
    args = ["check"]
    for path in inventories:
        args += ["-i", path]
    args += ["--reports", settings["drift_schedule_reports_dir"]]
    if settings.get("drift_schedule_metrics_file"):
        args += ["--metrics-file", settings["drift_schedule_metrics_file"]]
    if settings.get("drift_schedule_limit"):
        args += ["--limit", settings["drift_schedule_limit"]]
    if settings.get("drift_schedule_detect_only"):
        args.append("--detect-only")
    args += ["--timeout", str(settings["drift_schedule_run_timeout"])]
    return args


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"drift_schedule_problems": drift_schedule_problems, "drift_runner_args": drift_runner_args}
