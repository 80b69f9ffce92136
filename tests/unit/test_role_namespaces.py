"""No role takes over one of Kubernetes' own namespaces (issue 35): every namespace input that a role writes to (it
creates the namespace, labels its Pod Security level, puts its objects there, or deletes it) is refused by the role's
preflight, before any change, when it names kube-system, kube-public, kube-node-lease, default or any other kube-*
name; the message names the variable (the key path for nested data), the value and what is allowed. Namespace inputs
that a role only reads or names (where to find another component's pods, a NetworkPolicy's peer) may name kube-system:
tenancy_dns_namespace does, by default.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import yaml

from conftest import REPO_ROOT
from test_input_forms import preflight

from ansible_collections.gpu_ops.cluster.plugins.module_utils import input_forms

ROLES = REPO_ROOT / "roles"
SYSTEM = ["kube-system", "kube-public", "kube-node-lease", "default", "kube-gpu"]

# Namespace inputs a role writes to: (role, variable, what the role does there).
WRITTEN: Dict[str, Tuple[str, str]] = {
    "dcgm_exporter_namespace": ("dcgm_exporter", "creates it, labels it Pod Security privileged"),
    "drift_schedule_namespace": ("drift_schedule", "creates it, labels it Pod Security restricted"),
    "gpu_queues_kueue_namespace": ("gpu_queues", "creates it, labels it Pod Security restricted"),
    "gpu_validation_namespace": ("gpu_validation", "creates it, labels it Pod Security restricted, runs a Job there"),
    "grafana_namespace": ("grafana", "puts Grafana's objects there (the prometheus role's namespace)"),
    "nvidia_device_plugin_namespace": ("nvidia_device_plugin", "creates it, labels it Pod Security privileged"),
    "nvidia_dra_driver_namespace": ("nvidia_dra_driver", "creates it, labels it Pod Security privileged"),
    "prometheus_namespace": ("prometheus", "creates it, labels it Pod Security restricted"),
    "training_workloads_namespace": ("training_workloads", "puts its Job there (a tenancy team's namespace)"),
}
# Namespace inputs a role only reads or names: no takeover, so Kubernetes' own are allowed there.
NAMED_ONLY: Dict[str, str] = {
    "gpu_diagnose_device_plugin_namespace": "reads the device plugin's pods and logs",
    "gpu_diagnose_dcgm_exporter_namespace": "reads the exporter's pods and logs",
    "gpu_validation_device_plugin_namespace": "reads the device plugin's pods",
    "gpu_validation_dcgm_exporter_namespace": "reads the exporter's pods",
    "nvidia_mig_device_plugin_namespace": "restarts the device plugin's pod on the node it partitioned",
    "prometheus_exporter_namespace": "scrapes the exporter there",
    "tenancy_dns_namespace": "a NetworkPolicy peer: DNS runs in kube-system",
    "tenancy_monitoring_namespace": "a NetworkPolicy peer: Prometheus scrapes from there",
}


def _namespace_inputs() -> List[str]:
    found = []
    for path in sorted(ROLES.glob("*/defaults/main.yml")):
        found.extend(name for name in (yaml.safe_load(path.read_text()) or {}) if name.endswith("_namespace"))
    return sorted(found)


def test_every_namespace_input_is_classified():
    """A new namespace input must say whether its role writes there (then the rule applies) or only names it."""
    inputs = _namespace_inputs()
    assert "drift_schedule_namespace" in inputs and "tenancy_dns_namespace" in inputs
    assert sorted(set(WRITTEN) | set(NAMED_ONLY)) == inputs


@pytest.mark.parametrize("value", SYSTEM)
@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_a_system_namespace_is_refused_by_the_preflight(name, value):
    role = WRITTEN[name][0]
    problems = preflight(role).problems(**{name: value})
    named = [problem for problem in problems if re.match(r"^%s=" % re.escape(name), problem)]
    assert named, (name, value, problems)
    assert any(("'%s'" % value in problem or '"%s"' % value in problem) and "kube-system" in problem.split("allowed")[-1]
               for problem in named), named


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_a_namespace_of_its_own_passes(name):
    role = WRITTEN[name][0]
    assert preflight(role).problems(**{name: "team-ml"}) == []


@pytest.mark.parametrize("name", sorted(NAMED_ONLY))
def test_a_namespace_only_named_may_be_kube_system(name):
    role = next(path.parts[-3] for path in ROLES.glob("*/defaults/main.yml")
                if name in (yaml.safe_load(path.read_text()) or {}))
    assert preflight(role).problems(**{name: "kube-system"}) == []


@pytest.mark.parametrize("value", SYSTEM)
def test_a_team_named_after_a_system_namespace_is_refused_even_with_no_reserved_names(value):
    problems = preflight("tenancy").problems(tenancy_teams=[{"name": "team-ok"}, {"name": value}],
                                             tenancy_reserved_namespaces=[])
    assert any(problem.startswith("tenancy_teams[1].name=%r is a system namespace; allowed:" % value)
               for problem in problems), problems


@pytest.mark.parametrize("value", SYSTEM)
def test_the_form_refuses_kubernetes_own_namespaces(value):
    assert input_forms.form_problems("x_namespace", "role_namespace", value) == [
        'x_namespace="%s" is not a namespace a role may take; allowed: a DNS label (lower-case letters, digits and '
        "'-', starting and ending with a letter or digit, at most 63) other than default, kube-node-lease, "
        "kube-public, kube-system or any other kube-* name" % value]
    assert input_forms.is_system_namespace(value)


def test_the_form_keeps_the_dns_label_rule():
    assert input_forms.form_problems("x_namespace", "role_namespace", "gpu-drift") == []
    assert len(input_forms.form_problems("x_namespace", "role_namespace", "GPU_Drift")) == 1
    assert not input_forms.is_system_namespace("kueue-system")
