"""plugins/module_utils/k8s_values.py: the one place the forms of Kubernetes values are checked. Quantities go through
the kubernetes client's own parser, so the roles accept what the API server accepts."""

from __future__ import annotations

from decimal import Decimal

import pytest

from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_values import (
    is_dns_label,
    is_dns_subdomain,
    is_label_key,
    is_label_value,
    json_annotation,
    parse_quantity,
    quantity_problem,
)
from conftest import load_filter_plugin


@pytest.mark.parametrize(("value", "expected"), [
    ("1.5Gi", Decimal(1610612736)), ("0", Decimal(0)), ("500m", Decimal("0.5")), (8, Decimal(8)),
    ("1e3", Decimal(1000)), ("-1Gi", Decimal(-1073741824)),
    ("lots", None), ("", None), (True, None), ([1], None), (None, None), ("5 Gi", None), (" 4", None),
])
def test_parse_quantity(value, expected):
    assert parse_quantity(value) == expected


def test_quantity_problem_names_the_path_and_the_rule():
    assert quantity_problem("x.cpu", "1.5") is None
    assert quantity_problem("x.cpu", "0") is None
    assert quantity_problem("x.cpu", "0", positive=True) == "x.cpu='0'; allowed: a quantity above 0"
    assert quantity_problem("x.cpu", "-1") == "x.cpu='-1'; allowed: a quantity >= 0"
    assert quantity_problem("x.cpu", 4, strings_only=True).endswith("(quoted, as a string)")
    assert "allowed: a Kubernetes quantity" in quantity_problem("x.memory", "16 GiB")


@pytest.mark.parametrize(("check", "good", "bad"), [
    (is_dns_label, ["a", "gpu-0", "a" * 63], ["", "A", "-a", "a.b", "a" * 64, None, "a\n"]),
    # Kubernetes' IsDNS1123Subdomain: every dot-separated label starts and ends with a letter or digit.
    (is_dns_subdomain, ["a.b-c", "nvidia", "x" * 253], ["", "A.b", "a..b-", None, "a..b", "a.-b", "a-.b", "x" * 254]),
    (is_label_value, ["", "NVIDIA-H100-80GB-HBM3", "a_b.c"], ["-a", "a b", "a" * 64, 5, None]),
    (is_label_key, ["nvidia.com/gpu.present", "pool", "gpu-cluster.dev/pool"], ["", "/x", "Bad_Prefix/x", "a/b/", 3]),
])
def test_names_and_labels(check, good, bad):
    assert [value for value in good if not check(value)] == []
    assert [value for value in bad if check(value)] == []


def test_every_filter_takes_the_quantities_kubernetes_takes():
    """1.5Gi and 0 are quantities: the three regexes that used to judge them disagreed (monitoring refused both)."""
    monitoring = load_filter_plugin("monitoring")
    tenancy = load_filter_plugin("tenancy")
    workloads = load_filter_plugin("training_workloads")
    assert tenancy.tenancy_quantity_problems({"tenancy_default_cpu": "0", "tenancy_default_memory": "1.5Gi"}) == []
    problems = monitoring.prometheus_setting_problems
    assert not [p for p in problems({"prometheus_storage_size": "1.5Gi"}) if "prometheus_storage_size" in p]
    assert [p for p in problems({"prometheus_storage_size": "0"}) if "prometheus_storage_size" in p]
    job = {"name": "a", "kind": "tensorflow", "gpus": 1, "product": "NVIDIA-H100-80GB-HBM3", "cpu": "1.5",
           "memory": "1.5Gi"}
    assert not [p for p in workloads.training_workload_problems([job]) if ".cpu" in p or ".memory" in p]


@pytest.mark.parametrize(("annotations", "expected"), [
    ({"k": '{"since": "2026-01-01T00:00:00Z", "gpus": [3]}'}, {"since": "2026-01-01T00:00:00Z", "gpus": [3]}),
    ({}, None), (None, None), ({"k": ""}, None), ({"other": "{}"}, None),
    # a person's hand edit or another tool's value: read as nothing recorded, never an exception
    ({"k": "not json"}, None), ({"k": "[1, 2]"}, None), ({"k": "\"text\""}, None), ({"k": "null"}, None),
])
def test_json_annotation_reads_only_a_json_object(annotations, expected):
    assert json_annotation({"metadata": {"name": "n", "annotations": annotations}}, "k") == expected


def test_json_annotation_of_an_object_without_metadata():
    assert json_annotation({}, "k") is None


QUANTITIES = ["1.5Gi", "0", "500m", "8", "1e3", "-1Gi", "64Gi", "2.5", "100k", "1M", "0.1", "1Ei", "lots", "5Gb", "1.2.3"]


def test_the_parser_is_the_clients_own_and_agrees_with_it():
    """The parser loaded from the client's quantity.py alone answers as kubernetes.utils.parse_quantity does."""
    from kubernetes.utils import parse_quantity as client

    def upstream(value):
        try:
            return Decimal(client(value))
        except (ValueError, TypeError, ArithmeticError):
            return None

    assert [(value, parse_quantity(value)) for value in QUANTITIES] == [(value, upstream(value)) for value in QUANTITIES]
    assert parse_quantity("lots") is None and parse_quantity("1.5Gi") == Decimal(1610612736)


def test_a_quantity_does_not_import_the_generated_api_client():
    """Every Ansible worker that templates a quantity would import the whole client (about 0.2 s of CPU) otherwise."""
    import subprocess
    import sys
    code = ("import sys\n"
            "from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_values import parse_quantity\n"
            "assert parse_quantity('1.5Gi') == 1610612736, parse_quantity('1.5Gi')\n"
            "print(sorted(name for name in sys.modules if name.split('.')[0] == 'kubernetes'))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout
