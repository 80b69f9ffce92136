"""The nvidia_dra_driver role's filters: allocation modes and product classes refused before any change, and the
DeviceClass selectors (the driver chart's expressions for gpu.nvidia.com and mig.nvidia.com)."""

from __future__ import annotations

import pytest

from conftest import load_filter_plugin

dra = load_filter_plugin("dra")
VAR = "nvidia_dra_driver_product_classes"


def test_selectors_are_the_driver_charts_and_add_the_product():
    assert dra.dra_device_selector("gpu") == \
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    assert dra.dra_device_selector("mig") == \
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
    assert dra.dra_device_selector("gpu", "NVIDIA H200").endswith(
        " && device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'")


def test_modes_other_than_device_plugin_and_dra_are_named_with_the_node():
    problems = dra.dra_allocation_mode_problems({"(the cluster)": "dra", "gpu-h100-0": "DRA", "gpu-a100-0": None,
                                                 "gpu-l4-0": "device-plugin"}, "nvidia_dra_driver_allocation_mode")
    assert problems == [
        'nvidia_dra_driver_allocation_mode="DRA" on gpu-h100-0 is not an allocation mode; allowed: device-plugin or dra',
        "nvidia_dra_driver_allocation_mode=null on gpu-a100-0 is not an allocation mode; allowed: device-plugin or dra",
    ]


def test_good_product_classes_pass():
    assert dra.dra_product_class_problems([{"name": "h100.nvidia.com", "product": "NVIDIA H100 80GB HBM3"},
                                           {"name": "a100", "product": "NVIDIA A100-SXM4-40GB"}], VAR) == []


@pytest.mark.parametrize(("classes", "expected"), [
    ("h100", f'{VAR}="h100" is not a list'),
    ([{"name": "h100"}], f'{VAR}[0]={{"name": "h100"}} is not a product class'),
    ([{"name": "H100", "product": "x"}], f'{VAR}[0].name="H100" is not an object name'),
    ([{"name": "a", "product": "x"}, {"name": "a", "product": "y"}], f'{VAR}[1].name="a" is also {VAR}[0].name'),
    ([{"name": "a", "product": "it's"}], f'{VAR}[0].product="it\'s" is not a product name'),
    ([{"name": "a", "product": ""}], f'{VAR}[0].product="" is not a product name'),
])
def test_bad_product_classes_are_named_with_their_value_and_what_is_allowed(classes, expected):
    problems = dra.dra_product_class_problems(classes, VAR)
    assert len(problems) == 1 and problems[0].startswith(expected) and "allowed: " in problems[0], problems


# -- the role's version refusal, rendered by Ansible's templar as the play evaluates it ------------------------------


def _version_check(server: dict) -> tuple[bool, str]:
    """The preflight's 'Check that the cluster serves DRA' assertion on a k8s_cluster_info answer: (passes, message)."""
    from pathlib import Path

    import yaml
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    from conftest import install_collection_loader

    install_collection_loader()  # the assertion calls the shared filter gpu_ops.cluster.kubernetes_version_problems
    role = Path(__file__).resolve().parents[2] / "roles" / "nvidia_dra_driver"
    task = next(task for task in yaml.safe_load((role / "tasks" / "preflight.yml").read_text())
                if task["name"].startswith("Check that the cluster serves DRA"))
    variables = {"_nvidia_dra_driver_min_kubernetes": "1.34", "_nvidia_dra_driver_dra_nodes": ["gpu-h100-0"],
                 "__nvidia_dra_driver_cluster": {"version": {"server": {"kubernetes": server}}}}
    variables.update({name: trust_as_template(value) for name, value in task["vars"].items()})
    templar = Templar(loader=DataLoader(), variables=variables)
    that = templar.evaluate_expression(trust_as_template(task["ansible.builtin.assert"]["that"]))
    message = templar.template(trust_as_template(task["ansible.builtin.assert"]["fail_msg"]))
    return bool(that), " ".join(str(message).split())


@pytest.mark.parametrize(("server", "passes"), [
    ({"major": "1", "minor": "37", "gitVersion": "v1.37.2"}, True),
    ({"major": "1", "minor": "34", "gitVersion": "v1.34.0"}, True),
    ({"major": "1", "minor": "35+", "gitVersion": "v1.35.1-eks-1"}, True),  # managed clusters append '+'
    ({"major": "1", "minor": "33", "gitVersion": "v1.33.5"}, False),
    ({"major": "1", "minor": "9", "gitVersion": "v1.9.0"}, False),
])
def test_clusters_older_than_1_34_are_refused_naming_the_version_and_the_nodes(server, passes):
    ok, message = _version_check(server)
    assert ok is passes
    if not passes:
        assert f"the API server runs Kubernetes {server['gitVersion']}; dra mode " \
               "(nvidia_dra_driver_allocation_mode=dra on gpu-h100-0) needs 1.34 or newer" in message
        assert "or leave these nodes in device-plugin mode" in message


def test_a_cluster_newer_than_the_supported_range_is_refused_too():
    ok, message = _version_check({"major": "1", "minor": "38", "gitVersion": "v1.38.0"})
    assert not ok
    assert "the API server runs Kubernetes v1.38.0; this project supports 1.33 to 1.37" in message


@pytest.mark.parametrize("name", ["gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com",
                                  "compute-domain-daemon.nvidia.com", "compute-domain-default-channel.nvidia.com"])
def test_the_dra_driver_charts_device_class_names_are_refused(name):
    """Every DeviceClass the DRA driver's chart defines (deviceclass-*.yaml), not only the two this role creates."""
    assert dra.dra_product_class_problems([{"name": name, "product": "NVIDIA H100 80GB HBM3"}], VAR) == [
        f'{VAR}[0].name="{name}" is a DeviceClass NVIDIA\'s DRA driver defines; allowed: a name other than '
        "gpu.nvidia.com, mig.nvidia.com, vfio.gpu.nvidia.com, compute-domain-daemon.nvidia.com, "
        "compute-domain-default-channel.nvidia.com"]
    # A name that merely resembles one is the user's to take.
    assert dra.dra_product_class_problems([{"name": "h100." + name, "product": "NVIDIA H100 80GB HBM3"}], VAR) == []
