"""The cluster check in DRA mode: ResourceSlice devices counted against what each node should offer, the MIG
layout's resources under the device plugin's single and mixed strategies, and the claims Pending pods wait for.

Objects are shaped as kube-apiserver returns them (resource.k8s.io/v1); devices as NVIDIA's DRA driver names and types
them (kubernetes-sigs/dra-driver-nvidia-gpu deviceinfo.go, mig.go; see docs/dra.md).
"""

from __future__ import annotations

from typing import Any, Dict, List

from ansible_collections.gpu_ops.cluster.plugins.module_utils import gpu_cluster_dra as dra
from ansible_collections.gpu_ops.cluster.plugins.module_utils.gpu_cluster import check_cluster, expected_resources

from conftest import load_filter_plugin

DAEMONS = {
    "device_plugin": {"namespace": "nvidia-device-plugin", "selector": "app=nvidia-device-plugin", "required": False},
    "dcgm_exporter": {"namespace": "gpu-monitoring", "selector": "app=dcgm-exporter", "required": False},
}
DRA = {"driver": "gpu.nvidia.com", "mode_label": "nvidia.com/gpu.deploy.dra-driver", "error": None}
MODE = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.dra-driver": "true"}


def node(name: str, labels: Dict[str, str], gpus: int | None = None) -> Dict[str, Any]:
    allocatable = {"cpu": "96", "pods": "110", **({"nvidia.com/gpu": str(gpus)} if gpus is not None else {})}
    return {"metadata": {"name": name, "labels": labels},
            "status": {"capacity": dict(allocatable), "allocatable": allocatable,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def gpu_device(index: int, node_name: str) -> Dict[str, Any]:
    return {"name": f"gpu-{index}", "attributes": {"type": {"string": "gpu"},
                                                   "uuid": {"string": f"GPU-{node_name}-{index}"}}}


def mig_device(index: int, node_name: str, profile: str, start: int) -> Dict[str, Any]:
    return {"name": f"gpu-{index}-mig-{profile.replace('.', '')}-19-{start}",
            "attributes": {"type": {"string": "mig"}, "profile": {"string": profile},
                           "uuid": {"string": f"MIG-{node_name}-{index}-{start}"},
                           "parentUUID": {"string": f"GPU-{node_name}-{index}"}}}


def resource_slice(node_name: str, devices: List[Dict[str, Any]], generation: int = 1, count: int = 1,
                   driver: str = "gpu.nvidia.com", name: str | None = None) -> Dict[str, Any]:
    return {"metadata": {"name": name or f"{node_name}-{driver}"},
            "spec": {"driver": driver, "nodeName": node_name, "devices": devices,
                     "pool": {"name": node_name, "generation": generation, "resourceSliceCount": count}}}


def check(nodes, pods=(), *, expected=(), slices=(), claims=(), configs=None, error=None,
          daemons=None) -> Dict[str, Any]:
    return check_cluster(nodes, list(pods), [], expected_nodes=list(expected), sharing_configs=configs or {},
                         default_config="default", gpu_node_selector="nvidia.com/gpu.present=true",
                         daemons=daemons or DAEMONS,
                         slices=list(slices), claims=list(claims), dra=dict(DRA, error=error))


# -- nodes in DRA mode --------------------------------------------------------------------------------------------


def test_a_dra_node_is_not_flagged_as_gpu_less_and_its_devices_are_counted():
    """Before: a node in dra mode (no nvidia.com/gpu, the device plugin's pod kept off it) failed with "allocatable
    nvidia.com/gpu is 0, expected 8" and "device plugin pod missing"."""
    nodes = [node("dra-0", MODE)]
    slices = [resource_slice("dra-0", [gpu_device(i, "dra-0") for i in range(8)])]
    required = {name: dict(spec, required=True) for name, spec in DAEMONS.items()}
    pods = [{"metadata": {"namespace": "gpu-monitoring", "name": "dcgm", "labels": {"app": "dcgm-exporter"}},
             "spec": {"nodeName": "dra-0", "containers": []},
             "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}]
    result = check(nodes, pods, expected=[{"name": "dra-0", "gpus": 8}], slices=slices, daemons=required)
    assert result["healthy"], result["problems"]
    view = result["nodes"]["dra-0"]
    assert view["allocation_mode"] == "dra" and view["expected"] == {}
    assert view["dra"]["found"] == {"devices": {"gpu": 8}, "total": 8, "gpus": 8, "slices": 1}
    assert view["dra"]["expected"] is None and view["dra"]["expected_gpus"] == 8 and view["dra"]["allocated"] == 0
    assert view["daemons"]["device_plugin"] == "dra_mode"


def test_a_short_or_missing_slice_is_a_problem_naming_node_expected_and_found():
    nodes = [node("dra-0", MODE), node("dra-1", MODE)]
    slices = [resource_slice("dra-0", [gpu_device(i, "dra-0") for i in range(6)])]
    result = check(nodes, expected=[{"name": "dra-0", "gpus": 8}, {"name": "dra-1", "gpus": 4}], slices=slices)
    assert result["problems"] == [
        "dra-0: ResourceSlices of driver gpu.nvidia.com publish 6 devices (gpu=6) of 6 GPUs, expected 8 GPUs",
        "dra-1: no ResourceSlice of driver gpu.nvidia.com for the node: found 0 devices, expected 4 GPUs; "
        "is the DRA driver's kubelet plugin running there?"]


def test_the_mig_layout_from_the_facts_gives_the_expected_devices():
    layout = [{"index": 0, "enabled": True, "devices": {"1g.10gb": 7}},
              {"index": 1, "enabled": False, "devices": {}}]
    devices = [mig_device(0, "dra-0", "1g.10gb", start) for start in range(7)] + [gpu_device(1, "dra-0")]
    result = check([node("dra-0", MODE)], expected=[{"name": "dra-0", "gpus": 2, "mig": layout}],
                   slices=[resource_slice("dra-0", devices)])
    assert result["healthy"], result["problems"]
    assert result["nodes"]["dra-0"]["dra"]["expected"] == {"mig-1g.10gb": 7, "gpu": 1}
    # The slice still shows whole GPUs: the driver has not seen the new layout.
    stale = [resource_slice("dra-0", [gpu_device(i, "dra-0") for i in range(2)])]
    result = check([node("dra-0", MODE)], expected=[{"name": "dra-0", "gpus": 2, "mig": layout}], slices=stale)
    assert result["problems"] == ["dra-0: ResourceSlices of driver gpu.nvidia.com publish gpu=2, expected gpu=1, "
                                  "mig-1g.10gb=7 (2 GPUs, MIG layout from the host facts)"]


def test_without_a_layout_mig_devices_count_by_the_gpus_they_cover():
    devices = [mig_device(g, "dra-0", "3g.40gb", s) for g in range(4) for s in (0, 4)]
    result = check([node("dra-0", MODE)], expected=[{"name": "dra-0", "gpus": 4}],
                   slices=[resource_slice("dra-0", devices)])
    assert result["healthy"], result["problems"]
    assert result["nodes"]["dra-0"]["dra"]["found"]["gpus"] == 4


def test_only_the_newest_pool_generation_and_the_driver_count():
    old = resource_slice("dra-0", [gpu_device(i, "dra-0") for i in range(8)], generation=1, name="old")
    new = resource_slice("dra-0", [gpu_device(i, "dra-0") for i in range(4)], generation=2, count=2, name="new")
    other = resource_slice("dra-0", [gpu_device(9, "dra-0")], driver="other.example.com")
    result = check([node("dra-0", MODE)], expected=[{"name": "dra-0", "gpus": 8}], slices=[old, new, other])
    assert result["nodes"]["dra-0"]["dra"]["found"]["total"] == 4
    assert "dra-0: pool dra-0 has 1 of its 2 slices" in result["warnings"]


def test_gpus_served_twice_and_a_mode_the_node_does_not_have_are_problems():
    nodes = [node("dra-0", MODE, gpus=8), node("gpu-0", {"nvidia.com/gpu.present": "true"}, gpus=8)]
    slices = [resource_slice("dra-0", [gpu_device(i, "dra-0") for i in range(8)])]
    result = check(nodes, expected=[{"name": "dra-0", "gpus": 8}, {"name": "gpu-0", "gpus": 8,
                                                                     "allocation_mode": "dra"}], slices=slices)
    assert "dra-0: GPUs served twice: the device plugin advertises nvidia.com/gpu=8 and ResourceSlices publish 8 " \
           "devices" in result["problems"]
    assert "gpu-0: allocation mode is dra in the inventory, but the node has no label " \
           "nvidia.com/gpu.deploy.dra-driver (run the nvidia_dra_driver role)" in result["problems"]


def test_dra_objects_that_could_not_be_read_fail_only_nodes_in_dra_mode():
    result = check([node("dra-0", MODE)], expected=[{"name": "dra-0", "gpus": 8}], error="HTTP 403 Forbidden")
    assert result["problems"] == ["dra-0: ResourceSlices not read: HTTP 403 Forbidden"]
    plain = check([node("gpu-0", {"nvidia.com/gpu.present": "true"}, gpus=8)],
                  expected=[{"name": "gpu-0", "gpus": 8}], error="HTTP 404 Not Found")
    assert plain["healthy"] and "ResourceClaims not read: HTTP 404 Not Found" in plain["warnings"]


def test_allocated_devices_are_counted_per_node():
    slices = [resource_slice("dra-0", [gpu_device(i, "dra-0") for i in range(8)])]
    claims = [{"metadata": {"namespace": "a", "name": "c"}, "status": {"allocation": {"devices": {"results": [
        {"driver": "gpu.nvidia.com", "pool": "dra-0", "device": "gpu-0", "request": "gpus"},
        {"driver": "gpu.nvidia.com", "pool": "dra-0", "device": "gpu-1", "request": "gpus"},
        {"driver": "other.example.com", "pool": "dra-0", "device": "x", "request": "nic"}]}}}}]
    result = check([node("dra-0", MODE)], expected=[{"name": "dra-0", "gpus": 8}], slices=slices, claims=claims)
    assert result["nodes"]["dra-0"]["dra"]["allocated"] == 2


# -- pending claims -----------------------------------------------------------------------------------------------


def claim(namespace: str, name: str, count: int, allocated: bool = False) -> Dict[str, Any]:
    status = {"allocation": {"devices": {"results": []}}} if allocated else {}
    return {"metadata": {"namespace": namespace, "name": name},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": count}}]}},
            "status": status}


def claim_pod(namespace: str, name: str, refs: List[Dict[str, str]], message: str | None,
              statuses: List[Dict[str, str]] = ()) -> Dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}] \
        if message else []
    return {"metadata": {"namespace": namespace, "name": name},
            "spec": {"resourceClaims": refs, "containers": [{"name": "main", "image": "x"}]},
            "status": {"phase": "Pending", "conditions": conditions, "resourceClaimStatuses": list(statuses)}}


def test_claims_pending_pods_wait_for_carry_the_schedulers_message():
    message = "0/6 nodes are available: 3 cannot allocate all claims, 3 node(s) had untolerated taint."
    pods = [claim_pod("t", "nine", [{"name": "gpus", "resourceClaimName": "nine"}], message),
            claim_pod("t", "templ", [{"name": "gpus", "resourceClaimTemplateName": "two"}], None,
                      [{"name": "gpus", "resourceClaimName": "templ-gpus-x1"}]),
            claim_pod("t", "fresh", [{"name": "gpus", "resourceClaimTemplateName": "two"}], None),
            claim_pod("t", "ok", [{"name": "gpus", "resourceClaimName": "done"}], None)]
    claims = [claim("t", "nine", 9), claim("t", "templ-gpus-x1", 2), claim("t", "done", 1, allocated=True)]
    result = check([node("gpu-0", {"nvidia.com/gpu.present": "true"}, gpus=1)], pods, claims=claims)
    assert result["healthy"]  # Pending work is reported, not a failed cluster
    rows = {row["pod"]: row for row in result["pending_claims"]}
    assert set(rows) == {"nine", "templ", "fresh"}
    assert rows["nine"] == {"namespace": "t", "pod": "nine", "claim": "nine", "template": None, "exists": True,
                            "requests": [{"request": "gpus", "device_class": "gpu.nvidia.com", "count": 9}],
                            "reason": "Unschedulable", "message": message}
    assert rows["templ"]["claim"] == "templ-gpus-x1" and rows["templ"]["template"] == "two"
    assert rows["fresh"]["exists"] is False and rows["fresh"]["claim"] is None
    assert "t/nine: Pending on claim nine (gpus: gpu.nvidia.com x 9): " + message in result["warnings"]
    assert "t/fresh: Pending on claim ? from template two, not made yet: not scheduled yet" in result["warnings"]


def test_first_available_requests_list_each_alternative():
    spec = {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "h100.nvidia.com", "count": 1},
        {"name": "all-small", "deviceClassName": "mig.nvidia.com", "allocationMode": "All"}]}]}}
    assert dra._requests({"spec": spec}) == [
        {"request": "gpu/big", "device_class": "h100.nvidia.com", "count": 1},
        {"request": "gpu/all-small", "device_class": "mig.nvidia.com", "count": "All"}]


def test_the_dra_objects_are_read_only_where_needed():
    plain = [node("gpu-0", {"nvidia.com/gpu.present": "true"}, gpus=8)]
    assert not dra.wants_dra(plain, [], [{"name": "gpu-0", "gpus": 8}], DRA["mode_label"])
    assert dra.wants_dra(plain, [], [{"name": "gpu-0", "allocation_mode": "dra"}], DRA["mode_label"])
    assert dra.wants_dra([node("dra-0", MODE)], [], [], DRA["mode_label"])
    assert dra.wants_dra(plain, [claim_pod("t", "p", [{"name": "g", "resourceClaimName": "c"}], None)], [],
                         DRA["mode_label"])


# -- MIG under the device plugin ----------------------------------------------------------------------------------

MIXED = {"version": "v1", "flags": {"migStrategy": "mixed"}}
SINGLE = {"version": "v1", "flags": {"migStrategy": "single"}}


def test_mig_strategies_expect_the_layouts_resources_not_whole_gpus():
    layout = {0: {"enabled": True, "devices": {"1g.10gb": 7}}, 1: {"enabled": True, "devices": {"1g.10gb": 7}}}
    assert expected_resources(2, SINGLE, layout) == {"nvidia.com/gpu": 14}
    mixed = {0: {"enabled": True, "devices": {"3g.40gb": 2}}, 1: {"enabled": False, "devices": {}}}
    assert expected_resources(2, MIXED, mixed) == {"nvidia.com/gpu": 1, "nvidia.com/mig-3g.40gb": 2}
    assert expected_resources(2, MIXED, None) == {}  # no layout known: reported, not compared
    shared = dict(MIXED, sharing={"timeSlicing": {"resources": [{"name": "nvidia.com/mig-3g.40gb", "replicas": 2}]}})
    assert expected_resources(2, shared, mixed) == {"nvidia.com/gpu": 1, "nvidia.com/mig-3g.40gb": 4}


def test_a_mixed_node_short_of_its_mig_resources_is_a_problem():
    labels = {"nvidia.com/gpu.present": "true", "nvidia.com/device-plugin.config": "mixed"}
    short = node("gpu-0", labels, gpus=1)
    short["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] = "1"
    layout = [{"index": 0, "enabled": True, "devices": {"3g.40gb": 2}}, {"index": 1, "enabled": False, "devices": {}}]
    result = check([short], expected=[{"name": "gpu-0", "gpus": 2, "mig": layout}], configs={"mixed": MIXED})
    assert result["problems"] == ["gpu-0: allocatable nvidia.com/mig-3g.40gb is 1, expected 2 (2 GPUs, config mixed)"]


def test_the_layout_comes_from_the_host_facts():
    gpus = [{"index": 0, "mig_mode_current": "enabled", "mig_devices": [{"profile": "1g.10gb"}, {"profile": "1g.10gb"}]},
            {"index": 1, "mig_mode_current": "disabled", "mig_devices": []}]
    assert dra.layout_from_facts(gpus) == [{"index": 0, "enabled": True, "devices": {"1g.10gb": 2}},
                                           {"index": 1, "enabled": False, "devices": {}}]
    gpus[0]["mig_devices"][0]["profile"] = None  # an old driver's XML without profiles: not known
    assert dra.layout_from_facts(gpus) is None


# -- the role's expectations --------------------------------------------------------------------------------------


def test_expected_nodes_take_count_mode_and_layout_from_the_inventory_and_facts():
    expected_nodes = load_filter_plugin("gpu_validation").gpu_expected_nodes
    facts = {"gpu_count": 2, "gpus": [
        {"index": 0, "mig_mode_current": "enabled", "mig_devices": [{"profile": "3g.40gb"}]},
        {"index": 1, "mig_mode_current": "disabled", "mig_devices": []}]}
    hostvars = {"a": {"gpu_validation_expected_gpu_count": 8}, "b": {"ansible_facts": {"nvidia_gpu": facts}},
                "c": {}}
    assert expected_nodes(["a", "b", "c"], hostvars, {"a": "dra"}) == [
        {"name": "a", "gpus": 8, "allocation_mode": "dra"},
        {"name": "b", "gpus": 2, "mig": [{"index": 0, "enabled": True, "devices": {"3g.40gb": 1}},
                                         {"index": 1, "enabled": False, "devices": {}}]},
        {"name": "c", "gpus": None}]


# -- the module's reads -------------------------------------------------------------------------------------------


def test_the_module_lists_the_drivers_slices_and_every_claim_or_says_why_not(monkeypatch):
    from kubernetes.client.exceptions import ApiException

    from conftest import load_ansible_module

    module = load_ansible_module("gpu_cluster_check")
    calls = []

    def listed(api_client, path, page_size, timings=None, name="", query=()):
        calls.append((path, list(query), name))
        return [{"kind": name}]

    monkeypatch.setattr(module, "list_all", listed)
    assert module.read_dra(object(), 500, "gpu.nvidia.com", {}) == ([{"kind": "resourceslices"}],
                                                                    [{"kind": "resourceclaims"}], None)
    assert calls == [("/apis/resource.k8s.io/v1/resourceslices", [("fieldSelector", "spec.driver=gpu.nvidia.com")],
                      "resourceslices"), ("/apis/resource.k8s.io/v1/resourceclaims", [], "resourceclaims")]

    def missing(*args, **kwargs):
        raise ApiException(status=404, reason="Not Found")

    monkeypatch.setattr(module, "list_all", missing)
    assert module.read_dra(object(), 500, "gpu.nvidia.com", {}) == (
        [], [], "HTTP 404 Not Found listing resource.k8s.io/v1 objects")
