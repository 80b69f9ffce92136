"""plugins/module_utils/input_forms.py (the filter input_form_problems) and its promise: every role input that has a
form is checked for it in the role's preflight, before any change, by a message naming its path, value and what is
allowed.

The walk reads every role's meta/argument_specs.yml and classifies each option (and suboption) by the explicit rules of
FORMED below, minus the reasoned exceptions of NOT_FORMED. Then, for each formed input, it renders the role's preflight
as Ansible would up to the first task that reads the host or the cluster (its set_fact values and the *_problems
variables of its asserts; for the node roles, the __<role>_input_problems of vars/main.yml that main.yml asserts), with the role's defaults and vars, once as is (no problem may come out) and once per bad
value (a problem naming the input and the value must come out). A new formed input that no preflight checks fails here.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
import yaml

from conftest import COLLECTION_ROOT, REPO_ROOT, install_collection_loader, load_filter_plugin

from ansible_collections.gpu_ops.cluster.plugins.module_utils import input_forms

inputs_filter = load_filter_plugin("inputs")
ROLES = REPO_ROOT / "roles"

# ---- the validators -------------------------------------------------------------------------------------------------

GOOD = [
    ("port", 9400, {}), ("port", 1, {}), ("port", 65535, {}),
    ("port_name", "metrics", {}), ("port_name", "http-2", {}),
    ("count", 0, {}), ("count", 5, {"min": 1, "max": 5}),
    ("seconds", 300, {}), ("seconds", 60, {"min": 60}),
    ("prometheus_duration", "15d", {}), ("prometheus_duration", "1h30m", {}), ("prometheus_duration", "500ms", {}),
    ("cron", "17 * * * *", {}), ("cron", "@daily", {}), ("cron", "*/30 0-6 * jan mon-fri", {}),
    ("quantity", "1.5Gi", {}), ("quantity", "500m", {}), ("quantity", 8, {}), ("quantity", "0", {}),
    ("url", "http://gpu-lab-mirror:8080/cuda/", {}), ("url", "https://nvidia.github.io/libnvidia-container/gpgkey", {}),
    ("url", "", {"optional": True}),
    ("prometheus_url", "http://prometheus.monitoring.svc:9090", {}), ("prometheus_url", "https://m.example/prometheus/", {}),
    ("prometheus_url", "http://prometheus:9090/apis-proxy", {}), ("prometheus_url", "", {"optional": True}),
    ("tolerations", [], {}), ("tolerations", [{"operator": "Exists"}], {}),
    ("tolerations", [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                     {"key": "dedicated", "value": "gpu"}, {"key": "k", "effect": "NoExecute", "tolerationSeconds": 30}],
     {}),
    ("dns_label", "gpu-monitoring", {}), ("dns_subdomain", "system-node-critical", {}),
    ("dns_subdomain", "fast.ssd", {}), ("dns_subdomain", "", {"optional": True}), ("dns_subdomain", None, {"optional": True}),
    ("label_key", "nvidia.com/gpu.deploy.dcgm-exporter", {}), ("label_key", "tier", {}),
    ("label_value", "NVIDIA-H100-80GB-HBM3", {}), ("label_value", "", {}),
    ("label_selector", "app.kubernetes.io/name=dcgm-exporter", {}), ("label_selector", "a=b,c!=d", {}),
    ("image", "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04", {}),
    ("image", "localhost/gpu-ops-ee:latest", {}), ("image", "registry.example.com:5000/a/b@sha256:" + "0" * 64, {}),
    ("image_registry", "nvcr.io", {}), ("image_registry", "registry.example.com:5000/mirror", {}),
    ("image_repository", "nvidia/k8s/dcgm-exporter", {}), ("image_tag", "3.3.7-3.5.0-ubuntu22.04", {}),
    ("image_digest", "sha256:" + "a" * 64, {}),
    ("absolute_path", "/etc/containerd/config.toml", {}), ("path", "reports", {}), ("path", "~/.kube/config", {}),
    ("command", "containerd", {}), ("command", "/usr/bin/nvidia-container-runtime", {}),
    ("labels", {"gpu-cluster.dev/tier": "gold"}, {}), ("quantities", {"cpu": "100m", "memory": "256Mi"}, {}),
    ("resources", {"requests": {"cpu": "100m"}, "limits": {"memory": "512Mi"}}, {}),
    ("image_parts", {"registry": "nvcr.io", "repository": "nvidia/pytorch", "tag": "24.08-py3"}, {}),
    ("dns_label", ["default", "monitoring"], {"elements": True}),
]


@pytest.mark.parametrize(("form", "value", "options"), GOOD, ids=lambda item: str(item)[:40])
def test_a_value_of_the_form_passes(form, value, options):
    assert input_forms.form_problems("x_input", form, value, **options) == []


# (form, value, options, the exact message for path x_input)
BAD = [
    ("port", 0, {}, "x_input=0 is not a TCP port; allowed: an integer 1-65535"),
    ("port", 65536, {}, "x_input=65536 is not a TCP port; allowed: an integer 1-65535"),
    ("port", "9400", {}, 'x_input="9400" is not a TCP port; allowed: an integer 1-65535'),
    ("port", True, {}, "x_input=true is not a TCP port; allowed: an integer 1-65535"),
    ("port_name", "metrics-endpoint-x", {}, 'x_input="metrics-endpoint-x" is not a port name; allowed: an IANA service '
     "name: at most 15 lower-case letters, digits and '-', with a letter"),
    ("count", -1, {}, "x_input=-1 is not a whole number; allowed: an integer >= 0"),
    ("count", 6, {"min": 1, "max": 5}, "x_input=6 is not a whole number; allowed: an integer 1-5"),
    ("count", 1.5, {}, "x_input=1.5 is not a whole number; allowed: an integer >= 0"),
    ("seconds", 0, {}, "x_input=0 is not a number of seconds; allowed: an integer >= 1 (seconds)"),
    ("prometheus_duration", "15 days", {}, 'x_input="15 days" is not a Prometheus duration; allowed: units y, w, d, h, '
     "m, s, ms in that order, above 0, such as 15d, 12h, 30s or 1h30m"),
    ("prometheus_duration", "0s", {}, None), ("prometheus_duration", "30m1h", {}, None),
    ("cron", "* * * *", {}, 'x_input="* * * *" is not a cron schedule; allowed: five cron fields such as "17 * * * *", '
     "or @hourly, @daily, ..."),
    ("quantity", "1.5 Gi", {}, 'x_input="1.5 Gi" is not a Kubernetes quantity; allowed: a Kubernetes quantity such as '
     "8, 500m, 1.5Gi or 64Gi"),
    ("quantity", "0", {"positive": True}, None), ("quantity", "-1", {}, None), ("quantity", True, {}, None),
    ("url", "127.0.0.1:8080/cuda", {}, 'x_input="127.0.0.1:8080/cuda" is not a URL; allowed: http://host/path or '
     "https://host/path"),
    ("url", "", {}, 'x_input="" is not a URL; allowed: http://host/path or https://host/path'),
    ("url", "ftp://mirror.example/cuda", {"optional": True}, 'x_input="ftp://mirror.example/cuda" is not a URL; allowed: '
     '"" (not set) or http://host/path or https://host/path'),
    ("prometheus_url", "http://prometheus:9090/api/v1", {}, 'x_input="http://prometheus:9090/api/v1" is not a '
     "Prometheus server URL; allowed: the server's base URL, such as http://prometheus.monitoring.svc:9090 (or under "
     "its route prefix, .../prometheus), without /api/v1, a page or a query string: the API path is added to it"),
    ("prometheus_url", "http://prometheus:9090/api/v1/query", {}, None),
    ("prometheus_url", "http://prometheus:9090/prometheus/api/", {}, None),
    ("prometheus_url", "http://prometheus:9090/graph", {}, None),
    ("prometheus_url", "http://prometheus:9090/?x=1", {}, None),
    ("prometheus_url", "prometheus:9090", {}, None),
    ("tolerations", [{"key": "nvidia.com/gpu", "operator": "Exists", "value": "x"}], {},
     'x_input[0].value="x" is not allowed with operator Exists; allowed: no value'),
    ("tolerations", [{"operator": "Equal", "value": "x"}], {}, None),
    ("tolerations", [{"key": "Bad Key"}], {}, None),
    ("tolerations", [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 30}], {}, None),
    ("tolerations", [{"key": "k", "effect": "NoExecute", "tolerationSeconds": "30"}], {}, None),
    ("tolerations", [{"key": "k", "effect": "Never"}], {}, None),
    ("tolerations", [{"key": "k", "tolerate": True}], {}, None),
    ("tolerations", {"key": "k"}, {}, None),
    ("dns_label", "GPU_Monitoring", {}, 'x_input="GPU_Monitoring" is not a DNS label; allowed: lower-case letters, '
     "digits and '-', starting and ending with a letter or digit, at most 63"),
    ("dns_label", "a" * 64, {}, None), ("dns_subdomain", "Fast_SSD", {}, None),
    ("label_key", "Bad Key", {}, None), ("label_key", "-x/y", {}, None), ("label_value", "NVIDIA H100", {}, None),
    ("label_value", 1, {}, None),
    ("label_selector", "app in (a,b)", {}, 'x_input="app in (a,b)" is not a label selector; allowed: key=value or '
     "key!=value terms joined by ',', with label keys and values"),
    ("label_selector", "", {}, None),
    ("image", "Not An Image", {}, 'x_input="Not An Image" is not an image reference; allowed: an image reference such as '
     "registry.example.com/gpu-ops-ee:1.2.0 ([registry/]repository[:tag][@sha256:digest])"),
    ("image", "Registry/EE", {}, None), ("image_registry", "https://nvcr.io", {}, None),
    ("image_repository", "NVIDIA/pytorch", {}, None), ("image_tag", ".hidden", {}, None),
    ("image_digest", "sha256:xyz", {}, None),
    ("absolute_path", "etc/cdi/nvidia.yaml", {}, 'x_input="etc/cdi/nvidia.yaml" is not an absolute path; allowed: one '
     "line starting with /"),
    ("path", "", {}, None), ("path", "a\nb", {}, None), ("command", "nvidia runtime", {}, None),
    ("labels", {"gpu-cluster.dev/tier": 1}, {}, 'x_input["gpu-cluster.dev/tier"]=1 is not a label value; allowed: at '
     "most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit (a string)"),
    ("labels", {"Bad Key": "x"}, {}, 'x_input key "Bad Key" is not a label key; allowed: [prefix/]name, a DNS subdomain '
     "prefix and a name of 1-63 letters, digits, '-', '_' or '.'"),
    ("labels", "tier=gold", {}, 'x_input="tier=gold" is not a mapping of labels; allowed: {label key: label value as a '
     "string}"),
    ("quantities", {"cpu": "lots"}, {}, 'x_input.cpu="lots" is not a Kubernetes quantity; allowed: a Kubernetes '
     "quantity such as 8, 500m, 1.5Gi or 64Gi"),
    ("resources", {"requests": {"memory": "1 Gi"}}, {}, 'x_input.requests.memory="1 Gi" is not a Kubernetes quantity; '
     "allowed: a Kubernetes quantity such as 8, 500m, 1.5Gi or 64Gi"),
    ("resources", {"request": {}}, {}, "x_input.request is not a known key; allowed: requests, limits"),
    ("image_parts", {"registry": "nvcr.io", "repository": "nvidia/pytorch", "tag": "v 1"}, {},
     "x_input.tag=\"v 1\" is not an image tag; allowed: 1-128 letters, digits, '_', '.' or '-', not starting with '.' "
     "or '-'"),
    ("image_parts", {"registry": "nvcr.io", "repository": "nvidia/pytorch"}, {},
     "x_input.tag=null is not an image tag; allowed: 1-128 letters, digits, '_', '.' or '-', not starting with '.' or "
     "'-'"),
    ("dns_label", ["default", "Kube_System"], {"elements": True}, 'x_input[1]="Kube_System" is not a DNS label; '
     "allowed: lower-case letters, digits and '-', starting and ending with a letter or digit, at most 63"),
    ("dns_label", "default", {"elements": True}, None),
]


@pytest.mark.parametrize(("form", "value", "options", "message"), BAD, ids=lambda item: str(item)[:40])
def test_a_value_without_the_form_is_named_with_its_value_and_what_is_allowed(form, value, options, message):
    problems = input_forms.form_problems("x_input", form, value, **options)
    assert len(problems) == 1, problems
    if message is not None:
        assert problems == [message]
    assert problems[0].startswith("x_input") and "; allowed: " in problems[0], problems


def test_the_filter_takes_a_mapping_or_a_list_and_keeps_the_order():
    entries = {"b_port": {"form": "port", "value": 0}, "a_url": {"form": "url", "value": "x"},
               "c_ok": {"form": "count", "value": 3}}
    problems = inputs_filter.input_form_problems(entries)
    assert [problem.split("=")[0] for problem in problems] == ["b_port", "a_url"]
    assert inputs_filter.input_form_problems([dict(entry, path=path) for path, entry in entries.items()]) == problems


@pytest.mark.parametrize("entries", [{"x": {"form": "colour", "value": "red"}}, {"x": {"form": "port", "value": 1,
                                                                                     "maximum": 2}},
                                     {"x": {"value": 1}}, "x_port=1"])
def test_a_caller_mistake_is_an_error_not_a_problem(entries):
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError):
        inputs_filter.input_form_problems(entries)


def test_prometheus_durations_in_seconds():
    assert input_forms.prometheus_duration_seconds("1h30m") == 5400
    assert input_forms.prometheus_duration_seconds("1s500ms") == 1.5
    with pytest.raises(ValueError):
        input_forms.prometheus_duration_seconds("1.5h")


# ---- the walk: every formed input of every role is checked by its preflight -----------------------------------------

# An input is formed when its name (for a suboption: its own key) matches one of these rules, unless it has choices
# (the argument spec checks those) or NOT_FORMED names it. Each rule: its form family and a value of the right type
# but the wrong form, by argument-spec type; every formed input is also tried with BAD_ANY, wrong for every form.
FORMED: List[Tuple[str, str, Dict[str, Any]]] = [
    (r"_port$", "port", {"int": 0}),
    (r"_port_name$", "port name", {"str": "metrics-endpoint-x"}),
    (r"_timeout$", "timeout", {"int": 0, "str": "soon"}),
    (r"_(interval|retention_time|down_for|stale_after|randomized_delay)$", "duration", {"str": "soon"}),
    (r"_(on_calendar|schedule)$", "schedule", {"str": ""}),
    (r"_time_zone$", "time zone", {"str": "UTC+1 hour"}),
    (r"_(count|epochs|backoff_limit|run_as_user|run_as_group)$", "count", {"int": -1}),
    (r"_(warning|critical|ratio)$", "threshold", {"int": -1, "float": -1.0}),
    (r"_expected_gpus$", "counts by node", {"dict": {"gpu-node-01": 0}}),
    (r"(^|_)(size|cpu|memory|storage|request|resources)$", "quantity", {"str": "lots", "raw": "lots"}),
    (r"_url$", "URL", {"str": "ftp://mirror.example/x"}),
    (r"_targets$", "host:port", {"list": ["control-1"]}),
    (r"_(node_label|product_label|pool_label|extra_labels|external_labels)$", "label key", {"str": "Bad Key"}),
    (r"(^|_)node_pool$", "label value", {"str": "Bad Value!"}),
    (r"_namespaces?$", "namespace", {"str": "Bad_Namespace", "list": ["Bad_Namespace"]}),
    (r"(^name|_runtime_class|_class_name|_runtime_handler|_runtime_name|_priority_class|_storage_class|_config_map"
     r"|_secret|_exporter_service)$", "object name", {"str": "Bad_Name"}),
    (r"(^|_)device_class(es)?$", "DeviceClass name",
     {"str": "Bad_Class", "list": ["Bad_Class"], "dict": {"gpu.nvidia.com": -1}}),
    (r"_unit_name$", "systemd unit name", {"str": "drift.service"}),
    (r"(_image|_image_registry|_image_repository|_image_tag|_registry_mirror)$", "image",
     {"str": "Not An Image", "dict": {"registry": "nvcr.io", "repository": "Not An Image", "tag": "1"}}),
    (r"_gpu_resources?$", "resource name", {"str": "Bad Resource", "list": ["nvidia.com/tpu"]}),
    (r"_selector$", "label selector", {"str": "app in (a,b)"}),
    (r"_tolerations$", "toleration", {"list": [{"key": "nvidia.com/gpu", "operator": "Exist"}]}),
    (r"(_dir|_directory|_file|_json|_drop_in|_spec|_cert|_signing_key|_binary|_python|_runner|_inventories"
     r"|_ansible_config|_containerd_config)$", "path", {"str": "relative/path.txt"}),
]
BAD_ANY = "two\nlines"
# Inputs a rule would take for formed, and why they are not (or are checked where this walk cannot look).
NOT_FORMED: Dict[str, str] = {
    r"^__common_": "_common's parameters are the calling role's own inputs, checked in that role's preflight",
}
# A formed input whose form allows the rule's wrong value, with one that is wrong for it.
BAD_INSTEAD: Dict[str, Any] = {
    "gpu_validation_report_dir": "",  # relative paths are allowed: made absolute against the playbook's directory
    "gpu_health_report_dir": "",  # the same
    "gpu_driver_upgrade_report_dir": "",  # the same
    "nvidia_mig_report_dir": "",  # the same
    "gpu_diagnose_report_dir": "",  # the same
    "gpu_driver_upgrade_wait_for_jobs_timeout": -1,  # 0 is allowed: it does not wait
    "nvidia_mig_wait_for_jobs_timeout": -1,  # 0 is allowed: it does not wait
}
# Inputs whose judge is a program on the host, run by the role's preflight before any change: each must stay in the
# probe loop of that task file (systemd-analyze names the input, its value and what it accepts).
CHECKED_ON_THE_HOST: Dict[str, Tuple[str, str]] = {
    "drift_schedule_on_calendar": ("drift_schedule", "preflight_systemd.yml"),
    "drift_schedule_randomized_delay": ("drift_schedule", "preflight_systemd.yml"),
    "drift_schedule_timeout": ("drift_schedule", "preflight_systemd.yml"),
}
# Inputs checked only where they are used: the walk renders the preflight once per scenario and takes the union.
SCENARIOS: Dict[str, List[Dict[str, Any]]] = {
    "drift_schedule": [{"drift_schedule_method": "systemd"}, {"drift_schedule_method": "cronjob"}],
}
# What a play has that the bare templar has not, and the inventory values a role requires.
PLAY = {"groups": {"all": ["localhost"], "gpu_nodes": []}, "hostvars": {}, "inventory_hostname": "localhost",
        "playbook_dir": "/srv/gpu-ops/playbooks", "inventory_dir": "/srv/gpu-ops/inventories/lab",
        "ansible_playbook_python": "/opt/venv/bin/python", "ansible_config_file": "/srv/gpu-ops/ansible.cfg",
        "ansible_check_mode": False, "gpu_cluster_kubeconfig": "/etc/kubernetes/admin.conf",
        "ansible_facts": {"distribution": "Debian", "distribution_major_version": "12", "distribution_version": "12.8",
                          "os_family": "Debian", "architecture": "x86_64", "kernel": "6.1.0-28-amd64"},
        "ansible_managed": "Ansible managed"}
REQUIRED = {"training_workloads_namespace": "team-sample", "drift_schedule_ansible_config": "",
            "gpu_driver_upgrade_branch": "590"}
# A list-of-dict input's smallest valid element, into which a bad suboption value goes.
ELEMENTS = {"tenancy_teams": {"name": "team-sample"}, "gpu_queues_flavors": {"name": "gpu"},
            "nvidia_dra_driver_product_classes": {"name": "h100.nvidia.com", "product": "NVIDIA H100 80GB HBM3"}}
# The tasks a preflight runs before it reads the host or the cluster: what this walk renders.
INPUT_ACTIONS = ("ansible.builtin.assert", "ansible.builtin.set_fact")


def _specs() -> Iterator[Tuple[str, str, Dict[str, Any]]]:
    for path in sorted(ROLES.glob("*/meta/argument_specs.yml")):
        for entry_point in yaml.safe_load(path.read_text())["argument_specs"].values():
            for name, option in (entry_point.get("options") or {}).items():
                yield path.parts[-3], name, option


def _rule(name: str, option: Dict[str, Any], full: str) -> Optional[Tuple[str, Dict[str, Any]]]:
    if option.get("choices") or option.get("type") == "bool" or any(re.search(pattern, full) for pattern in NOT_FORMED):
        return None
    return next(((family, bad) for pattern, family, bad in FORMED if re.search(pattern, name)), None)


def formed_inputs() -> List[Tuple[str, str, str, Any]]:
    """(role, top-level variable, path, bad value) for every formed input and each of its bad values."""
    found = []
    for role, name, option in _specs():
        children = option.get("options") or {}
        for path, key, spec in [(name, name, option)] + [("%s[0].%s" % (name, sub), sub, subspec)
                                                         for sub, subspec in children.items()]:
            rule = _rule(key, spec, path)
            if rule is None:
                continue
            typed = BAD_INSTEAD.get(path, rule[1].get(spec.get("type", "str")))
            for bad in [BAD_ANY] + ([typed] if typed is not None else []):
                found.append((role, name, path, bad))
    return found


@pytest.mark.parametrize("path", sorted(CHECKED_ON_THE_HOST))
def test_an_input_judged_on_the_host_is_probed_by_its_preflight(path):
    role, task_file = CHECKED_ON_THE_HOST[path]
    assert any(found_path == path for found_role, _name, found_path, _bad in formed_inputs() if found_role == role)
    tasks = yaml.safe_load((ROLES / role / "tasks" / task_file).read_text())
    probed = [probe.get("name") for task in tasks if isinstance(task.get("loop"), list) for probe in task["loop"]
              if isinstance(probe, dict)]
    assert path in probed, (path, probed)
    assert "import_tasks: %s" % task_file in (ROLES / role / "tasks" / "preflight.yml").read_text()


def test_the_rules_find_the_inputs_the_issue_names():
    """The classification itself: a rule that stopped matching would make the walk below vacuous."""
    paths = {path for _role, _name, path, _bad in formed_inputs()}
    for expected in ("dcgm_exporter_port", "training_workloads_master_port", "tenancy_delete_timeout",
                     "nvidia_driver_reboot_timeout", "drift_schedule_timeout", "prometheus_scrape_interval",
                     "tenancy_default_memory", "tenancy_teams[0].cpu", "tenancy_teams[0].name",
                     "tenancy_teams[0].node_pool", "cuda_toolkit_mirror_url", "grafana_prometheus_url",
                     "dcgm_exporter_node_label", "gpu_scheduling_extra_labels", "prometheus_external_labels",
                     "drift_schedule_image", "training_workloads_pytorch_image", "grafana_image_tag",
                     "nvidia_container_toolkit_cdi_spec", "nvidia_driver_module_signing_key",
                     "gpu_validation_gpu_node_selector", "gpu_validation_expected_gpu_count", "drift_schedule_schedule",
                     "training_workloads_device_class", "tenancy_gpu_device_classes", "tenancy_teams[0].device_classes"):
        assert expected in paths, expected
    assert not any(path.startswith("__common_") or path.endswith("_kubeconfig") for path in paths)


class Preflight:
    """A role's preflight input checks rendered by Ansible's templar, as a play would run them."""

    def __init__(self, role: str) -> None:
        from ansible.parsing.dataloader import DataLoader

        install_collection_loader()
        self.role = role
        self.loader = DataLoader()
        self.base: Dict[str, Any] = dict(PLAY, role_path=str(ROLES / role))
        for path in (ROLES / role / "defaults" / "main.yml", ROLES / role / "vars" / "main.yml"):
            if path.exists():
                self.base.update(self.loader.load_from_file(str(path), trusted_as_template=True) or {})
        self.base.update({name: value for name, value in REQUIRED.items() if name in self.base})
        self.tasks: List[Dict[str, Any]] = []
        for task in self.loader.load_from_file(str(ROLES / role / "tasks" / "preflight.yml"), trusted_as_template=True):
            if not any(action in task for action in INPUT_ACTIONS):
                break
            self.tasks.append(task)

    def problems(self, **overrides: Any) -> List[str]:
        from ansible.template import Templar

        found: List[str] = []
        for scenario in SCENARIOS.get(self.role, [{}]):
            variables = dict(self.base, **scenario, **overrides)
            for task in self.tasks:
                templar = Templar(loader=self.loader, variables=variables)
                if "ansible.builtin.set_fact" in task and "loop" not in task:
                    variables.update({name: templar.template(value)
                                      for name, value in task["ansible.builtin.set_fact"].items()})
                for name, value in (task.get("vars") or {}).items() if "ansible.builtin.assert" in task else ():
                    if name.endswith("_problems"):
                        found.extend(str(problem) for problem in Templar(loader=self.loader, variables=variables)
                                     .template(value))
            # The node roles check every input in one assertion of main.yml on this role variable (vars/main.yml).
            inputs = "__%s_input_problems" % self.role
            if inputs in variables:
                found.extend(str(problem) for problem in Templar(loader=self.loader, variables=variables)
                             .template(variables[inputs]))
        return found


_PREFLIGHTS: Dict[str, Preflight] = {}


def preflight(role: str) -> Preflight:
    if role not in _PREFLIGHTS:
        _PREFLIGHTS[role] = Preflight(role)
    return _PREFLIGHTS[role]


CHECKED_ROLES = sorted({role for role, _name, _path, _bad in formed_inputs()})


def _inventory(name: str) -> Dict[str, Any]:
    values: Dict[str, Any] = {}
    for path in sorted((REPO_ROOT / "inventories" / name / "group_vars").glob("*/*.yml")):
        values.update(yaml.safe_load(path.read_text()) or {})
    hosts = yaml.safe_load((REPO_ROOT / "inventories" / name / "hosts.yml").read_text())
    for group in hosts["all"]["children"].values():
        for host in (group.get("hosts") or {}).values():
            values.update({key: value for key, value in (host or {}).items() if not key.startswith("ansible_")})
    return values


@pytest.mark.parametrize("inventory", [None, "lab", "example"])
@pytest.mark.parametrize("role", CHECKED_ROLES)
def test_the_defaults_and_the_inventories_pass_every_check(role, inventory):
    values = _inventory(inventory) if inventory else {}
    assert preflight(role).problems(**values) == []


def _shown(bad: Any) -> set:
    """How a message may show the bad value, or for structured data the bad part of it (JSON or Python repr)."""
    if isinstance(bad, dict):
        return set().union(*(_shown(value) for value in bad.values()))
    if isinstance(bad, list):
        return set().union(*(_shown(value) for value in bad))
    return {json.dumps(bad), repr(bad)}


@pytest.mark.parametrize(("role", "name", "path", "bad"),
                         [case for case in formed_inputs() if case[2] not in CHECKED_ON_THE_HOST],
                         ids=lambda item: str(item)[:60])
def test_every_formed_input_is_checked_by_its_preflight(role, name, path, bad):
    if "[0]." in path:
        element = dict(ELEMENTS[name], **{path.split("[0].", 1)[1]: bad})
        value: Any = [element]
    else:
        value = bad
    problems = preflight(role).problems(**{name: value})
    named = re.compile(r"^%s(?:[=\[. ]|$)" % re.escape(path))
    shown = _shown(bad)
    assert any(named.match(problem) and "allowed" in problem and any(text in problem for text in shown)
               for problem in problems), \
        "%s=%r is not refused by roles/%s/tasks/preflight.yml with a message naming it, its value and what is " \
        "allowed; problems: %s" % (path, bad, role, problems)
