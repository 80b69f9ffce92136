"""DRA mode on the lab's real control plane: the nvidia_dra_driver role labels the nodes of a pool in dra mode and
applies the DeviceClasses, the DRA-driver double publishes their ResourceSlices, and the real kube-scheduler
allocates ResourceClaims (the real controller manager makes them from ResourceClaimTemplates) and binds the pods.

The test uses simulated nodes of its own (tainted, so no other test's pods land on them) and runs only the role's
tag of playbooks/cluster.yml with an inventory of them, so the lab's shared device plugin config is left alone.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
import yaml

import cluster
import config as lab_config
from conftest import ROOT, Lab, playbook_env, recap_changed, wait_for

H100 = "NVIDIA H100 80GB HBM3"
POOLS = {
    "dra-h100": lab_config.GpuSpec(H100, 8, 81559, True),
    "dra-a100": lab_config.GpuSpec("NVIDIA A100-SXM4-40GB", 4, 40960, True),
    "dra-l4": lab_config.GpuSpec("NVIDIA L4", 2, 23034, False),
}
NODES = {"dra-h100-0": "dra-h100", "dra-a100-0": "dra-a100", "dra-l4-0": "dra-l4"}
TAINT = {"key": "gpu-lab.dev/dra-test", "value": "true", "effect": "NoSchedule"}
MODE_LABEL = "nvidia.com/gpu.deploy.dra-driver"
PRODUCT_CLASSES = [{"name": "h100.nvidia.com", "product": H100}]


def inventory_of(lab: Lab, modes: dict[str, str], extra: dict | None = None,
                 host_vars: dict[str, dict] | None = None) -> dict:
    """The test's nodes as gpu_nodes (`modes`: a node's own nvidia_dra_driver_allocation_mode, the others take the
    cluster's default; `host_vars`: more of a node's inventory variables), the lab's kubeconfig on cluster_control."""
    def node_vars(name: str) -> dict:
        own = {"nvidia_dra_driver_allocation_mode": modes[name]} if name in modes else {}
        return {**own, **(host_vars or {}).get(name, {})}

    return {"all": {"children": {
        "gpu_nodes": {"hosts": {name: node_vars(name) for name in NODES}},
        "cluster_control": {
            "hosts": {"localhost": {"ansible_connection": "local",
                                    "ansible_python_interpreter": str(ROOT / ".venv" / "bin" / "python")}},
            "vars": {"gpu_cluster_kubeconfig": str(lab.kubeconfig),
                     "nvidia_dra_driver_product_classes": PRODUCT_CLASSES, **(extra or {})}}}}}


def run_role(lab: Lab, modes: dict[str, str], *args: str, extra: dict | None = None,
             host_vars: dict[str, dict] | None = None) -> tuple[int, str]:
    """playbooks/cluster.yml, the nvidia_dra_driver tag only, with the test's nodes as gpu_nodes."""
    inventory = inventory_of(lab, modes, extra, host_vars)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hosts.yml"
        path.write_text(yaml.safe_dump(inventory))
        result = subprocess.run(["ansible-playbook", "-i", str(path), "playbooks/cluster.yml", "--tags",
                                 "nvidia_dra_driver", *args], cwd=ROOT, env=playbook_env(), capture_output=True,
                                text=True, check=False, timeout=600)
    return result.returncode, result.stdout + result.stderr


def resource_api(lab: Lab):  # noqa: ANN201
    from kubernetes import client

    return client.ResourceV1Api(lab.api_client)


def slices_by_node(lab: Lab) -> dict[str, int]:
    """Devices each node offers through gpu.nvidia.com ResourceSlices."""
    found: dict[str, int] = {}
    for item in resource_api(lab).list_resource_slice().items:
        if item.spec.driver == "gpu.nvidia.com" and item.spec.node_name:
            found[item.spec.node_name] = found.get(item.spec.node_name, 0) + len(item.spec.devices or [])
    return found


def advertised(lab: Lab, name: str) -> int:
    return int((lab.core.read_node(name).status.allocatable or {}).get("nvidia.com/gpu", "0"))


def settled(lab: Lab, expected_dra: set[str]) -> bool:
    """Every test node serves its GPUs one way only: a slice in dra mode, nvidia.com/gpu otherwise."""
    slices = slices_by_node(lab)
    for name, pool in NODES.items():
        count = POOLS[pool].count
        want = (count, 0) if name in expected_dra else (0, count)
        if (slices.get(name, 0), advertised(lab, name)) != want:
            return False
    return True


@pytest.fixture(scope="module")
def dra_nodes(lab: Lab) -> Iterator[list[str]]:
    for name, pool in NODES.items():
        spec = POOLS[pool]
        manifest = cluster.node_manifest(name, lab_config.NodePool(pool, 1, False, "64", "512Gi", spec))
        manifest["spec"]["taints"] = [TAINT]
        lab.core.create_node(manifest)
    wait_for(lambda: settled(lab, set()), 120, "the DRA test nodes Ready with their GPUs advertised")
    yield list(NODES)
    for name in NODES:
        lab.core.delete_node(name)
    wait_for(lambda: not set(slices_by_node(lab)) & set(NODES), 60, "the test nodes' ResourceSlices to go")


@pytest.fixture(scope="module")
def dra_mode(lab: Lab, dra_nodes: list[str]) -> Iterator[dict[str, str]]:
    """The H100 and A100 nodes in dra mode, the L4 node left in the cluster's default (device-plugin)."""
    modes = {"dra-h100-0": "dra", "dra-a100-0": "dra"}
    rc, output = run_role(lab, modes)
    assert rc == 0, output[-3000:]
    wait_for(lambda: settled(lab, set(modes)), 60, "slices for the nodes in dra mode and nvidia.com/gpu withdrawn")
    yield modes
    rc, output = run_role(lab, {})
    assert rc == 0, output[-3000:]


def pod(name: str, claims: list[dict]) -> dict:
    """A pod that holds its claims and stays Running on its simulated node; restricted Pod Security."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {cluster.HOLD_RUNNING_ANNOTATION: "true"}},
        "spec": {
            "tolerations": [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
            "resourceClaims": claims,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main", "image": "registry.example/cuda:12", "command": ["sleep", "infinity"],
                "resources": {"claims": [{"name": claim["name"]} for claim in claims]},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }


def claim_spec(count: int, device_class: str = "gpu.nvidia.com", selector: str | None = None) -> dict:
    exactly: dict = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}


def create_claim(lab: Lab, namespace: str, name: str, spec: dict) -> None:
    resource_api(lab).create_namespaced_resource_claim(
        namespace, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                    "spec": spec})


def bound_node(lab: Lab, namespace: str, name: str) -> str | None:
    return lab.core.read_namespaced_pod(name, namespace).spec.node_name


def allocation(lab: Lab, namespace: str, claim: str) -> list[tuple[str, str]]:
    status = resource_api(lab).read_namespaced_resource_claim(claim, namespace).status
    results = (status.allocation.devices.results or []) if status and status.allocation else []
    return [(result.pool, result.device) for result in results]


# -- the role -----------------------------------------------------------------------------------------------------


def test_a_second_run_and_a_check_run_change_nothing(lab: Lab, dra_mode: dict[str, str]) -> None:
    rc, output = run_role(lab, dra_mode)
    assert rc == 0 and recap_changed(output) == 0, output[-3000:]
    rc, output = run_role(lab, dra_mode, "--check")
    assert rc == 0 and recap_changed(output) == 0, output[-3000:]
    labels = {name: lab.core.read_node(name).metadata.labels.get(MODE_LABEL) for name in NODES}
    assert labels == {"dra-h100-0": "true", "dra-a100-0": "true", "dra-l4-0": None}
    classes = {item.metadata.name: item.spec.selectors[0].cel.expression
               for item in resource_api(lab).list_device_class().items}
    assert classes["gpu.nvidia.com"] == \
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    assert classes["mig.nvidia.com"] == \
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
    assert classes["h100.nvidia.com"].endswith(f"productName == '{H100}'")
    daemonset = lab.apps.read_namespaced_daemon_set("nvidia-dra-driver-gpu-kubelet-plugin", "nvidia-dra-driver-gpu")
    term = daemonset.spec.template.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    assert [(e.key, e.operator, e.values) for e in term.node_selector_terms[0].match_expressions] == \
        [(MODE_LABEL, "In", ["true"])]


def test_bad_input_is_refused_naming_the_variable_and_value(lab: Lab, dra_nodes: list[str]) -> None:
    rc, output = run_role(lab, {"dra-l4-0": "DRA"},
                          extra={"nvidia_dra_driver_product_classes": [{"name": "H100", "product": H100}]})
    assert rc != 0
    assert 'nvidia_dra_driver_allocation_mode="DRA" on dra-l4-0 is not an allocation mode; allowed: ' \
           "device-plugin or dra" in output
    assert 'nvidia_dra_driver_product_classes[0].name="H100" is not an object name' in output
    assert lab.core.read_node("dra-l4-0").metadata.labels.get(MODE_LABEL) is None  # refused before any change


def test_a_node_without_cdi_or_with_an_old_driver_branch_is_refused_before_any_change(lab: Lab, dra_nodes) -> None:
    rc, output = run_role(lab, {"dra-a100-0": "dra", "dra-l4-0": "dra"}, host_vars={
        "dra-l4-0": {"nvidia_container_toolkit_cdi": "never"}, "dra-a100-0": {"nvidia_driver_branch": "550"},
        "dra-h100-0": {"nvidia_container_toolkit_cdi": "never"}})  # not in dra mode here: not judged
    assert rc != 0
    assert 'nvidia_container_toolkit_cdi="never" on dra-l4-0: dra mode needs CDI' in output, output[-3000:]
    assert 'nvidia_driver_branch="550" on dra-a100-0: the DRA driver for GPUs supports driver branch 565 or newer' \
        in output, output[-3000:]
    assert 'nvidia_container_toolkit_cdi="never" on dra-h100-0' not in output
    assert lab.core.read_node("dra-l4-0").metadata.labels.get(MODE_LABEL) is None  # refused before any change


# -- allocation by the real scheduler -----------------------------------------------------------------------------


def test_a_four_gpu_claim_lands_on_the_node_with_four_free_devices(lab: Lab, dra_mode, namespace) -> None:
    ns = namespace()
    # Five GPUs from a template (the controller manager makes the claim): only the 8-GPU H100 node has five.
    resource_api(lab).create_namespaced_resource_claim_template(ns, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "five"},
        "spec": {"spec": claim_spec(5)}})
    lab.core.create_namespaced_pod(ns, pod("five", [{"name": "gpus", "resourceClaimTemplateName": "five"}]))
    wait_for(lambda: bound_node(lab, ns, "five"), 60, "the five-GPU pod to be bound")
    assert bound_node(lab, ns, "five") == "dra-h100-0"
    # Four GPUs now: the H100 node has three left, the A100 node four.
    create_claim(lab, ns, "four", claim_spec(4))
    lab.core.create_namespaced_pod(ns, pod("four", [{"name": "gpus", "resourceClaimName": "four"}]))
    wait_for(lambda: bound_node(lab, ns, "four"), 60, "the four-GPU pod to be bound")
    assert bound_node(lab, ns, "four") == "dra-a100-0"
    assert sorted(allocation(lab, ns, "four")) == [("dra-a100-0", f"gpu-{index}") for index in range(4)]
    # Never on the node in device-plugin mode, and nothing taken from its nvidia.com/gpu.
    assert advertised(lab, "dra-l4-0") == 2


def test_a_cel_selector_on_the_product_lands_on_an_h100(lab: Lab, dra_mode, namespace) -> None:
    ns = namespace()
    create_claim(lab, ns, "by-selector", claim_spec(
        1, selector=f"device.attributes['gpu.nvidia.com'].productName == '{H100}'"))
    create_claim(lab, ns, "by-class", claim_spec(1, device_class="h100.nvidia.com"))
    for name in ("by-selector", "by-class"):
        lab.core.create_namespaced_pod(ns, pod(name, [{"name": "gpus", "resourceClaimName": name}]))
    for name in ("by-selector", "by-class"):
        wait_for(lambda name=name: bound_node(lab, ns, name), 60, f"pod {name} to be bound")
        assert bound_node(lab, ns, name) == "dra-h100-0"
        [(pool, _device)] = allocation(lab, ns, name)
        assert pool == "dra-h100-0"


def wait_unschedulable(lab: Lab, ns: str, name: str) -> str:
    """The scheduler's message once it has marked the pod Unschedulable (PodScheduled False)."""

    def unschedulable() -> str:
        status = lab.core.read_namespaced_pod(name, ns).status
        condition = next((c for c in status.conditions or [] if c.type == "PodScheduled"), None)
        return condition.message if condition and condition.reason == "Unschedulable" else ""

    return wait_for(unschedulable, 60, f"the scheduler to report pod {name} unschedulable")


def test_a_claim_nobody_can_satisfy_stays_pending_with_the_schedulers_reason(lab: Lab, dra_mode, namespace) -> None:
    ns = namespace()
    create_claim(lab, ns, "nine", claim_spec(9))  # no node has nine GPUs

    lab.core.create_namespaced_pod(ns, pod("nine", [{"name": "gpus", "resourceClaimName": "nine"}]))

    message = wait_unschedulable(lab, ns, "nine")
    assert lab.core.read_namespaced_pod("nine", ns).status.phase == "Pending"
    assert "cannot allocate all claims" in message, message
    assert allocation(lab, ns, "nine") == []


def test_a_deviceclass_quota_refuses_a_claim_over_it(lab: Lab, dra_mode, namespace) -> None:
    from kubernetes.client.exceptions import ApiException

    ns = namespace()
    lab.core.create_namespaced_resource_quota(ns, {
        "metadata": {"name": "gpus"},
        "spec": {"hard": {"gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "2"}}})
    wait_for(lambda: lab.core.read_namespaced_resource_quota("gpus", ns).status.hard, 30, "the quota's status")
    create_claim(lab, ns, "two", claim_spec(2))
    with pytest.raises(ApiException) as refused:
        create_claim(lab, ns, "one-more", claim_spec(1))
    assert refused.value.status == 403 and "exceeded quota" in refused.value.body, refused.value.body


def test_mig_devices_are_claimable_through_mig_nvidia_com(lab: Lab, dra_mode, namespace) -> None:
    ns = namespace()
    lab.core.patch_node("dra-a100-0", {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.5gb"}}})
    try:
        wait_for(lambda: slices_by_node(lab).get("dra-a100-0") == 4 * 7, 60, "the A100 node's 28 MIG devices")
        create_claim(lab, ns, "mig", claim_spec(
            1, device_class="mig.nvidia.com", selector="device.attributes['gpu.nvidia.com'].profile == '1g.5gb'"))
        lab.core.create_namespaced_pod(ns, pod("mig", [{"name": "gpus", "resourceClaimName": "mig"}]))
        wait_for(lambda: bound_node(lab, ns, "mig"), 60, "the MIG pod to be bound")
        assert bound_node(lab, ns, "mig") == "dra-a100-0"
        [(pool, device)] = allocation(lab, ns, "mig")
        assert pool == "dra-a100-0" and device.startswith("gpu-") and "-mig-1g5gb-19-" in device
    finally:
        lab.core.patch_node("dra-a100-0", {"metadata": {"labels": {"nvidia.com/mig.config": None}}})
        wait_for(lambda: slices_by_node(lab).get("dra-a100-0") == 4, 60, "the A100 node's whole GPUs again")


# -- switching a pool ---------------------------------------------------------------------------------------------


def test_switching_a_pool_to_dra_and_back_never_serves_a_gpu_twice(lab: Lab, dra_mode) -> None:
    """After each switch every node serves its GPUs one way only (slice devices vs allocatable nvidia.com/gpu)."""
    to_dra = dict(dra_mode, **{"dra-l4-0": "dra"})
    rc, output = run_role(lab, to_dra)
    assert rc == 0, output[-3000:]
    wait_for(lambda: settled(lab, set(to_dra)), 60, "dra-l4-0 served by DRA only")
    assert slices_by_node(lab)["dra-l4-0"] == 2 and advertised(lab, "dra-l4-0") == 0
    rc, output = run_role(lab, dra_mode)
    assert rc == 0, output[-3000:]
    wait_for(lambda: settled(lab, set(dra_mode)), 60, "dra-l4-0 back on the device plugin only")
    assert "dra-l4-0" not in slices_by_node(lab) and advertised(lab, "dra-l4-0") == 2


# -- validation (playbooks/validate.yml's cluster check) on nodes in dra mode ------------------------------------------


def validate(lab: Lab, modes: dict[str, str], report_dir: Path, counts: dict[str, int] | None = None
             ) -> tuple[int, dict, str, str]:
    """playbooks/validate.yml's cluster part (--limit cluster_control, no smoke Job) with the test's nodes as gpu_nodes
    and their GPU counts (POOLS, or `counts`) in the inventory; the JSON report, the text summary and the output."""
    counts = {name: POOLS[pool].count for name, pool in NODES.items()} | (counts or {})
    inventory = inventory_of(lab, modes, extra={"gpu_validation_smoke_test": False,
                                                "gpu_validation_report_dir": str(report_dir)},
                             host_vars={name: {"gpu_validation_expected_gpu_count": count}
                                        for name, count in counts.items()})
    path = report_dir / "hosts.yml"
    path.write_text(yaml.safe_dump(inventory))
    result = subprocess.run(["ansible-playbook", "-i", str(path), "playbooks/validate.yml", "--limit",
                             "cluster_control"], cwd=ROOT, env=playbook_env(), capture_output=True, text=True,
                            check=False, timeout=600)
    report_file, text_file = report_dir / "validation.json", report_dir / "validation.txt"
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    return result.returncode, report, text_file.read_text() if text_file.exists() else "", \
        result.stdout + result.stderr


def test_validation_counts_the_slice_devices_of_nodes_in_dra_mode(lab: Lab, dra_mode, tmp_path) -> None:
    """Before: a node in dra mode advertises no nvidia.com/gpu and failed as "allocatable nvidia.com/gpu is 0"."""
    rc, report, text, output = validate(lab, dra_mode, tmp_path)
    assert report, output[-3000:]
    nodes = report["cluster"]["nodes"]
    assert [p for p in report["problems"] if p.split(":")[0] in NODES] == [], report["problems"]
    for name, gpus in (("dra-h100-0", 8), ("dra-a100-0", 4)):
        assert nodes[name]["allocation_mode"] == "dra" and nodes[name]["allocatable"] == {}
        found = nodes[name]["dra"]["found"]
        assert (found["devices"], found["gpus"], nodes[name]["dra"]["expected_gpus"]) == ({"gpu": gpus}, gpus, gpus)
        assert f"{name}: Ready, dra mode, ResourceSlice devices gpu={gpus} on {gpus} GPUs (expected {gpus} GPUs)" \
            in text
    assert nodes["dra-l4-0"]["allocation_mode"] == "device-plugin"
    assert nodes["dra-l4-0"]["expected"] == {"nvidia.com/gpu": 2} and nodes["dra-l4-0"]["dra"] is None


def test_validation_reports_a_claim_nobody_can_satisfy_with_the_schedulers_message(lab: Lab, dra_mode, namespace,
                                                                                   tmp_path) -> None:
    ns = namespace()
    create_claim(lab, ns, "nine", claim_spec(9))  # no node has nine GPUs
    lab.core.create_namespaced_pod(ns, pod("nine", [{"name": "gpus", "resourceClaimName": "nine"}]))

    message = wait_unschedulable(lab, ns, "nine")
    rc, report, text, output = validate(lab, dra_mode, tmp_path)
    assert report, output[-3000:]
    [row] = [row for row in report["cluster"]["pending_claims"] if row["namespace"] == ns]
    assert (row["pod"], row["claim"], row["exists"], row["reason"]) == ("nine", "nine", True, "Unschedulable")
    assert row["requests"] == [{"request": "gpus", "device_class": "gpu.nvidia.com", "count": 9}]
    assert "cannot allocate all claims" in row["message"] and row["message"] == message
    assert f"{ns}/nine waits for claim nine: {message}" in text
    assert f"{ns}/nine: Pending on claim nine (gpus: gpu.nvidia.com x 9): {message}" in report["warnings"]


def test_validation_reports_a_node_whose_slice_is_short_or_missing(lab: Lab, dra_mode, tmp_path) -> None:
    """dra-h100-0's driver sees 6 of its 8 GPUs (the lab node's GPU count lowered); dra-a100-0's kubelet plugin
    publishes nothing (a driver version the DRA-driver double cannot parse makes it drop the node's slice)."""
    count_key, version_key = "gpu-lab.dev/gpu-count", "gpu-lab.dev/driver-version"
    lab.core.patch_node("dra-h100-0", {"metadata": {"annotations": {count_key: "6"}}})
    lab.core.patch_node("dra-a100-0", {"metadata": {"annotations": {version_key: "not-a-version"}}})
    try:
        wait_for(lambda: slices_by_node(lab).get("dra-h100-0") == 6 and "dra-a100-0" not in slices_by_node(lab),
                 60, "a short slice on dra-h100-0 and none on dra-a100-0")
        rc, report, text, output = validate(lab, dra_mode, tmp_path)
    finally:
        lab.core.patch_node("dra-h100-0", {"metadata": {"annotations": {count_key: "8"}}})
        lab.core.patch_node("dra-a100-0", {"metadata": {"annotations": {version_key: None}}})
        wait_for(lambda: settled(lab, set(dra_mode)), 60, "the test nodes' full slices again")
    assert rc != 0 and "GPU validation failed" in output, output[-3000:]
    assert "dra-h100-0: ResourceSlices of driver gpu.nvidia.com publish 6 devices (gpu=6) of 6 GPUs, expected 8 GPUs" \
        in report["problems"]
    assert "dra-a100-0: no ResourceSlice of driver gpu.nvidia.com for the node: found 0 devices, expected 4 GPUs; is " \
           "the DRA driver's kubelet plugin running there?" in report["problems"]
    assert "Verdict: FAILED" in text
