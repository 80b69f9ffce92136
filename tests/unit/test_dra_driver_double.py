"""The lab's DRA-driver double: the ResourceSlices it builds, which nodes get one, and the device-plugin double's
withdrawal from nodes in DRA mode (the two never serve the same GPUs).

Attribute names and types follow kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/deviceinfo.go
(GpuInfo.Attributes, CanonicalName) and partitions.go (fullGpuCapacity); see lab/dra_driver_double.py.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lab"))

import device_plugin_double as dpd  # noqa: E402
import dra_driver_double as dra  # noqa: E402

H100 = dpd.GpuHardware(product="NVIDIA H100 80GB HBM3", count=8, memory_mib=81559, mig_capable=True)


def node(name: str, *, product: str = "NVIDIA H100 80GB HBM3", count: int = 8, memory: int = 81559,
         dra_mode: bool = True, kwok: bool = True, extra_labels: dict | None = None,
         extra_annotations: dict | None = None) -> dict:
    labels = {"gpu-lab.dev/pool": name.rsplit("-", 1)[0], **(extra_labels or {})}
    if dra_mode:
        labels[dra.DRA_MODE_LABEL] = "true"
    annotations = {dpd.PRODUCT_ANNOTATION: product, dpd.COUNT_ANNOTATION: str(count),
                   dpd.MEMORY_ANNOTATION: str(memory), dpd.MIG_CAPABLE_ANNOTATION: "true",
                   **(extra_annotations or {})}
    if kwok:
        annotations[dpd.KWOK_NODE_ANNOTATION] = dpd.KWOK_NODE_VALUE
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations}, "status": {}}


def cpu_node(name: str) -> dict:
    return {"metadata": {"name": name, "labels": {dra.DRA_MODE_LABEL: "true"},
                         "annotations": {dpd.KWOK_NODE_ANNOTATION: dpd.KWOK_NODE_VALUE}}}


def stored(body: dict, resource_version: str = "7") -> dict:
    """A slice as the API server returns it: the body plus server fields."""
    item = json.loads(json.dumps(body))
    item["metadata"].update({"resourceVersion": resource_version, "uid": "u-" + body["metadata"]["name"]})
    return item


# -- the slice -----------------------------------------------------------------------------------------------------


def test_slice_of_an_h100_node_names_and_types_as_the_real_driver():
    body = dra.desired_slice("gpu-h100-0", H100)
    assert body["apiVersion"] == "resource.k8s.io/v1" and body["kind"] == "ResourceSlice"
    spec = body["spec"]
    assert spec["driver"] == "gpu.nvidia.com" and spec["nodeName"] == "gpu-h100-0"
    assert spec["pool"] == {"name": "gpu-h100-0", "generation": 1, "resourceSliceCount": 1}
    assert [device["name"] for device in spec["devices"]] == [f"gpu-{index}" for index in range(8)]
    first = spec["devices"][0]
    assert first["attributes"] == {
        "type": {"string": "gpu"},
        "uuid": {"string": dra.gpu_uuid("gpu-h100-0", 0)},
        "index": {"int": 0},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "565.57.1"},
        "cudaDriverVersion": {"version": "12.7.0"},
    }
    assert first["capacity"] == {"memory": {"value": "81559Mi"}}
    assert len({device["attributes"]["uuid"]["string"] for device in spec["devices"]}) == 8


def test_every_device_fits_the_api_limits():
    """resource.k8s.io/v1: at most 32 attributes and capacities per device; names are C identifiers; one slice holds
    at most 128 devices."""
    body = dra.desired_slice("n", dpd.GpuHardware("NVIDIA H200", 8, 143771, True))
    for device in body["spec"]["devices"]:
        assert len(device["attributes"]) + len(device["capacity"]) <= 32
        for name, value in device["attributes"].items():
            assert name.isidentifier() and len(value) == 1
    assert len(body["spec"]["devices"]) <= 128


def nvidia_smi_double():
    """lab/doubles/nvidia-smi as a module (a script without .py; registered so its dataclasses resolve)."""
    name = "gpu_lab_nvidia_smi_double"
    if name not in sys.modules:
        loader = importlib.machinery.SourceFileLoader(name, str(ROOT / "lab" / "doubles" / "nvidia-smi"))
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
        sys.modules[name] = module
        loader.exec_module(module)
    return sys.modules[name]


def test_uuids_match_the_nvidia_smi_double():
    smi = nvidia_smi_double()
    assert dra.gpu_uuid("gpu-h100-1", 3) == smi.gpu_uuid("gpu-h100-1", 3)


def test_product_facts_match_the_nvidia_smi_double_catalogue():
    smi = nvidia_smi_double()
    for name, facts in dra.PRODUCTS.items():
        product = smi.CATALOGUE[name]
        assert (facts.architecture, facts.compute_capability, facts.driver_version, facts.cuda_driver_version) == \
            (product.architecture, product.compute_cap, product.default_driver, product.default_cuda), name


@pytest.mark.parametrize(("version", "expected"), [
    ("565.57.01", "565.57.1"), ("9.0", "9.0.0"), ("12", "12.0.0"), ("580.126.09", "580.126.9")])
def test_versions_are_semver_as_the_driver_writes_them(version, expected):
    assert dra.semver(version) == expected


@pytest.mark.parametrize("version", ["", "abc", "1.2.3.4", "1..2"])
def test_bad_versions_are_refused(version):
    with pytest.raises(ValueError):
        dra.semver(version)


def test_driver_version_annotation_overrides_the_product_default():
    nodes = [node("gpu-h100-0", extra_annotations={dra.DRIVER_VERSION_ANNOTATION: "590.48.01"})]
    [body] = dra.plan(nodes, []).create
    assert {d["attributes"]["driverVersion"]["version"] for d in body["spec"]["devices"]} == {"590.48.1"}


def test_unknown_product_still_gets_a_slice():
    [body] = dra.plan([node("gpu-x-0", product="NVIDIA B200", count=2, memory=183359)], []).create
    assert body["spec"]["devices"][1]["attributes"]["productName"] == {"string": "NVIDIA B200"}
    assert body["spec"]["devices"][1]["capacity"]["memory"]["value"] == "183359Mi"


# -- which nodes ------------------------------------------------------------------------------------------------------


def test_only_simulated_gpu_nodes_in_dra_mode_get_a_slice():
    nodes = [node("gpu-h100-0"), node("gpu-h100-1", dra_mode=False), node("real-0", kwok=False), cpu_node("cpu-0"),
             node("gpu-a100-0", extra_labels={dra.DRA_MODE_LABEL: "false"}, dra_mode=False)]
    todo = dra.plan(nodes, [])
    assert [body["metadata"]["name"] for body in todo.create] == ["gpu-h100-0-gpu.nvidia.com"]
    assert todo.update == [] and todo.delete == [] and todo.errors == {}


def test_broken_annotations_or_driver_version_are_errors_not_slices():
    broken = node("gpu-h100-0")
    broken["metadata"]["annotations"][dpd.COUNT_ANNOTATION] = "eight"
    bad_driver = node("gpu-h100-1", extra_annotations={dra.DRIVER_VERSION_ANNOTATION: "latest"})
    todo = dra.plan([broken, bad_driver], [])
    assert todo.create == []
    assert "gpu-lab.dev/gpu-count" in todo.errors["gpu-h100-0"]
    assert "gpu-lab.dev/driver-version='latest'" in todo.errors["gpu-h100-1"]


def test_no_first_slice_while_the_device_plugin_still_advertises_the_gpus():
    switching = node("gpu-h100-0")
    switching["status"] = {"allocatable": {"cpu": "192", "nvidia.com/gpu": "8"}}
    assert dra.plan([switching], []).create == []
    switching["status"]["allocatable"].pop("nvidia.com/gpu")
    assert len(dra.plan([switching], []).create) == 1


def test_a_second_pass_changes_nothing():
    nodes = [node(f"gpu-h100-{index}") for index in range(3)]
    first = dra.plan(nodes, [])
    again = dra.plan(nodes, [stored(body) for body in first.create])
    assert again.create == [] and again.update == [] and again.delete == []


def test_a_changed_node_replaces_its_slice_with_a_new_pool_generation():
    current = stored(dra.desired_slice("gpu-h100-0", H100, generation=3), resource_version="42")
    changed = node("gpu-h100-0", count=4)
    todo = dra.plan([changed], [current])
    [body] = todo.update
    assert body["metadata"]["resourceVersion"] == "42"
    assert body["spec"]["pool"]["generation"] == 4
    assert len(body["spec"]["devices"]) == 4
    assert todo.create == [] and todo.delete == []


def test_slices_of_nodes_that_left_dra_mode_or_the_cluster_are_deleted():
    slices = [stored(dra.desired_slice(name, H100)) for name in ("gpu-h100-0", "gpu-h100-1", "gone-0")]
    nodes = [node("gpu-h100-0"), node("gpu-h100-1", dra_mode=False)]
    todo = dra.plan(nodes, slices)
    assert todo.delete == ["gone-0-gpu.nvidia.com", "gpu-h100-1-gpu.nvidia.com"]
    assert todo.create == [] and todo.update == []


def test_a_steady_pass_over_a_thousand_nodes_builds_no_device(monkeypatch):
    """Cheap at the 1000-node lab: once the slices are there, a pass compares input hashes and builds nothing."""
    nodes = [node(f"gpu-h100-{index}", extra_labels={dpd.MIG_CONFIG_LABEL: "all-1g.10gb"} if index % 2 else {})
             for index in range(1000)]
    first = dra.plan(nodes, [])
    assert len(first.create) == 1000
    slices = [stored(body) for body in first.create]
    monkeypatch.setattr(dra, "devices", lambda *args: pytest.fail("a steady pass built devices"))
    again = dra.plan(nodes, slices)
    assert again.create == [] and again.update == [] and again.delete == []


def test_the_content_hash_follows_every_input():
    layout = dpd.layout_from_label(H100, {dpd.MIG_CONFIG_LABEL: "all-1g.10gb"})
    off = dpd.layout_from_label(H100, {})
    base = dra.content_hash("n", H100, None, off)
    assert base == dra.content_hash("n", H100, None, None)
    others = {dra.content_hash("m", H100, None, off), dra.content_hash("n", H100, "590.48.01", off),
              dra.content_hash("n", dpd.GpuHardware(H100.product, 4, H100.memory_mib, True), None, off),
              dra.content_hash("n", H100, None, layout),
              dra.content_hash("n", H100, None, dpd.layout_from_state(node_state(
                  *[gpu_state(i, "1g.10gb", "1g.10gb") for i in range(8)])))}
    assert base not in others and len(others) == 5


# -- the I/O pass, against a fake API -----------------------------------------------------------------------------


class FakeResourceApi:
    def __init__(self, slices: list[dict]) -> None:
        self.slices = {item["metadata"]["name"]: item for item in slices}
        self.calls: list[tuple[str, str]] = []

    def list_resource_slice(self, label_selector: str, _preload_content: bool):
        assert label_selector == dra.OWNER_LABEL
        return SimpleNamespace(data=json.dumps({"items": list(self.slices.values())}).encode())

    def create_resource_slice(self, body, _preload_content):
        self.calls.append(("create", body["metadata"]["name"]))
        self.slices[body["metadata"]["name"]] = stored(body)
        return SimpleNamespace(data=b"{}")

    def replace_resource_slice(self, name, body, _preload_content):
        self.calls.append(("replace", name))
        self.slices[name] = stored(body)
        return SimpleNamespace(data=b"{}")

    def delete_resource_slice(self, name, _preload_content):
        self.calls.append(("delete", name))
        del self.slices[name]
        return SimpleNamespace(data=b"{}")


class FakeCoreApi:
    def __init__(self, nodes: list[dict]) -> None:
        self.nodes = nodes

    def list_node(self, _preload_content: bool):
        return SimpleNamespace(data=json.dumps({"items": self.nodes}).encode())


def test_reconcile_creates_then_is_quiet_then_deletes():
    core = FakeCoreApi([node("gpu-h100-0"), node("gpu-h100-1")])
    resource = FakeResourceApi([])
    result = dra.reconcile_once(core, resource, workers=2)
    assert (result.created, result.updated, result.deleted) == (2, 0, 0)
    resource.calls.clear()
    assert dra.reconcile_once(core, resource).created == 0 and resource.calls == []
    core.nodes[1]["metadata"]["labels"].pop(dra.DRA_MODE_LABEL)
    result = dra.reconcile_once(core, resource)
    assert result.deleted == 1 and resource.calls == [("delete", "gpu-h100-1-gpu.nvidia.com")]


# -- the device-plugin double in DRA mode ----------------------------------------------------------------------------


def plugin_view(labels: dict) -> dpd.NodeView:
    raw = node("gpu-h100-0", dra_mode=False, extra_labels=labels)
    raw["status"] = {"capacity": {"cpu": "192", "nvidia.com/gpu": "8"}, "allocatable": {"cpu": "192",
                                                                                          "nvidia.com/gpu": "8"}}
    return dpd.NodeView.of(raw)


@pytest.mark.parametrize(("labels", "serves"), [
    ({}, True),
    ({dpd.DEVICE_PLUGIN_DEPLOY_LABEL: "true"}, True),
    ({dpd.DEVICE_PLUGIN_DEPLOY_LABEL: "false"}, False),
    ({dpd.DRA_MODE_LABEL: "true"}, False),
    ({dpd.DEVICE_PLUGIN_DEPLOY_LABEL: "true", dpd.DRA_MODE_LABEL: "true"}, False),  # mid-switch: DRA wins
    ({dpd.DRA_MODE_LABEL: "false"}, True),
])
def test_device_plugin_double_withdraws_where_it_does_not_serve(labels, serves):
    view = plugin_view(labels)
    advertisement, _config = dpd._plan(view, None, "default", {})
    status, _metadata = dpd.node_patch(view, advertisement)
    if serves:
        assert advertisement.resources == {"nvidia.com/gpu": 8} and status is None
    else:
        assert advertisement.resources == {}
        assert status == {"status": {"capacity": {"nvidia.com/gpu": None}, "allocatable": {"nvidia.com/gpu": None}}}
        assert advertisement.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"  # GFD keeps labelling


def test_double_and_dra_double_agree_on_the_mode_label():
    assert dpd.DRA_MODE_LABEL == dra.DRA_MODE_LABEL
    sys.path.insert(0, str(ROOT / "lab"))
    import cluster

    assert cluster.DRA_MODE_LABEL == dra.DRA_MODE_LABEL


def test_the_lab_waits_for_a_dra_mode_node_without_nvidia_gpu():
    """lab/cluster.py's wait for GPUs advertised: a node in DRA mode has none (its GPUs are in a ResourceSlice)."""
    import cluster

    def node_object(labels: dict, allocatable: dict) -> SimpleNamespace:
        return SimpleNamespace(metadata=SimpleNamespace(labels=labels, annotations={dpd.COUNT_ANNOTATION: "8"}),
                               status=SimpleNamespace(allocatable=allocatable))

    assert not cluster.gpu_advertised(node_object({}, {"cpu": "192"}))
    assert cluster.gpu_advertised(node_object({}, {"nvidia.com/gpu": "8"}))
    assert cluster.gpu_advertised(node_object({dra.DRA_MODE_LABEL: "true"}, {"cpu": "192"}))


# -- MIG devices ------------------------------------------------------------------------------------------------------


def test_a_mig_enabled_node_publishes_mig_devices_named_and_typed_as_the_driver():
    labelled = node("gpu-a100-0", product="NVIDIA A100-SXM4-40GB", count=4, memory=40960,
                    extra_labels={dpd.MIG_CONFIG_LABEL: "all-1g.5gb"})
    [body] = dra.plan([labelled], []).create
    devices = body["spec"]["devices"]
    assert len(devices) == 4 * 7 and {d["attributes"]["type"]["string"] for d in devices} == {"mig"}
    first = devices[0]
    # 1g.5gb on A100 40GB: GI profile id 19, one memory slice, placements 0..6 (NVIDIA's MIG user guide).
    assert first["name"] == "gpu-0-mig-1g5gb-19-0"
    assert first["attributes"]["profile"] == {"string": "1g.5gb"}
    assert first["attributes"]["parentUUID"] == {"string": dra.gpu_uuid("gpu-a100-0", 0)}
    assert first["attributes"]["uuid"]["string"].startswith("MIG-")
    assert first["capacity"] == {"memory": {"value": "5120Mi"}, "memorySlice0": {"value": "1"}}
    assert [d["name"] for d in devices[:7]] == [f"gpu-0-mig-1g5gb-19-{start}" for start in range(7)]
    assert len({d["attributes"]["uuid"]["string"] for d in devices}) == 28


def test_mig_device_names_follow_the_canonical_form():
    assert dra.mig_device_name(3, "1g.10gb+me", 20, 6) == "gpu-3-mig-1g10gb-me-20-6"
    assert dra.mig_device_name(0, "7g.80gb", 0, 0) == "gpu-0-mig-7g80gb-0-0"


def test_a_mig_layout_the_gpu_cannot_have_is_an_error_not_a_slice():
    not_capable = node("gpu-l4-0", product="NVIDIA L4", count=1, memory=23034,
                       extra_labels={dpd.MIG_CONFIG_LABEL: "all-1g.10gb"})
    not_capable["metadata"]["annotations"][dpd.MIG_CAPABLE_ANNOTATION] = "false"
    unknown = node("gpu-h100-0", extra_labels={dpd.MIG_CONFIG_LABEL: "all-9g.99gb"})
    todo = dra.plan([not_capable, unknown], [])
    assert todo.create == [] and set(todo.errors) == {"gpu-l4-0", "gpu-h100-0"}
    assert "not MIG-capable" in todo.errors["gpu-l4-0"]


def test_changing_the_mig_layout_replaces_the_slice():
    plain = dra.plan([node("gpu-h100-0")], [])
    current = stored(plain.create[0])
    todo = dra.plan([node("gpu-h100-0", extra_labels={dpd.MIG_CONFIG_LABEL: "all-3g.40gb"})], [current])
    [body] = todo.update
    assert [d["name"] for d in body["spec"]["devices"][:2]] == ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4"]
    assert len(body["spec"]["devices"]) == 16 and body["spec"]["pool"]["generation"] == 2


# -- MIG devices from a lab node container's nvidia-smi (faked podman; no container is started) ---------------------


def gpu_state(index: int, *profiles: str, enabled: bool = True, product: str = H100.product) -> dpd.GpuMigState:
    return dpd.GpuMigState(index, product, True, enabled, tuple(profiles))


def node_state(*gpus: dpd.GpuMigState) -> dpd.NodeMigState:
    return dpd.NodeMigState(tuple(gpus))


A100_ANSWER = (
    "0, NVIDIA A100-SXM4-40GB, Enabled\n1, NVIDIA A100-SXM4-40GB, Disabled\n@@gpu-lab-mig@@\n"
    "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-2f46499f-c364-5968-49f5-d728006a2799)\n"
    "  MIG 3g.20gb      Device  0: (UUID: MIG-5485b1ca-fc02-687b-abde-4cfe807ec4ef)\n"
    "  MIG 1g.5gb       Device  1: (UUID: MIG-6485b1ca-fc02-687b-abde-4cfe807ec4ef)\n"
    "  MIG 1g.5gb       Device  2: (UUID: MIG-7485b1ca-fc02-687b-abde-4cfe807ec4ef)\n"
    "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-3f46499f-c364-5968-49f5-d728006a2799)\n")


class FakePodman:
    """Stands for podman: `ps` lists the lab node containers, `exec` answers the read script for a running one."""

    def __init__(self, containers: dict[str, str], answers: dict[str, tuple[int, str]]) -> None:
        self.containers, self.answers, self.calls = containers, answers, []

    def __call__(self, argv: list[str], **kwargs) -> "subprocess.CompletedProcess":
        import subprocess

        self.calls.append(argv)
        if argv[1] == "ps":
            listing = [{"Names": [name], "State": state} for name, state in self.containers.items()]
            return subprocess.CompletedProcess(argv, 0, json.dumps(listing), "")
        assert argv[1] == "exec" and argv[3:5] == ["sh", "-c"] and argv[5] == dpd.MIG_READ_SCRIPT
        code, out = self.answers[argv[2]]
        return subprocess.CompletedProcess(argv, code, out if code == 0 else "", "" if code == 0 else out)


def a100(name: str, **labels: str) -> dict:
    return node(name, product="NVIDIA A100-SXM4-40GB", count=4, memory=40960, extra_labels=labels)


def test_a_node_container_gives_the_mig_devices_gpu_by_gpu_and_the_label_is_ignored():
    podman = FakePodman({"gpu-a100-0": "running"}, {"gpu-a100-0": (0, A100_ANSWER)})
    states = dpd.NodeMigStates(dpd.PodmanMigReader(runner=podman), refresh_s=0)
    nodes = [a100("gpu-a100-0", **{dpd.MIG_CONFIG_LABEL: "all-1g.5gb"}),
             a100("gpu-a100-7", **{dpd.MIG_CONFIG_LABEL: "all-1g.5gb"})]  # kwok only: the label
    readings = states.current(n["metadata"]["name"] for n in nodes if dra.is_dra_gpu_node(n))
    todo = dra.plan(nodes, [], readings)
    bodies = {body["spec"]["nodeName"]: body for body in todo.create}
    names = [d["name"] for d in bodies["gpu-a100-0"]["spec"]["devices"]]
    # GPU 0: 3g.20gb + 2 x 1g.5gb (the node's nvidia-smi, placed by the tables); GPU 1 whole; 2 GPUs (nvidia-smi's).
    assert names == ["gpu-0-mig-3g20gb-9-0", "gpu-0-mig-1g5gb-19-4", "gpu-0-mig-1g5gb-19-5", "gpu-1"]
    assert len(bodies["gpu-a100-7"]["spec"]["devices"]) == 4 * 7
    assert ["podman", "exec", "gpu-a100-0", "sh", "-c", dpd.MIG_READ_SCRIPT] in podman.calls
    assert not any("gpu-a100-7" in call for call in podman.calls)


def test_a_changed_container_state_replaces_the_slice_and_a_steady_one_does_not():
    first = dra.plan([a100("gpu-a100-0")], [], {"gpu-a100-0": node_state(
        gpu_state(0, enabled=False, product="NVIDIA A100-SXM4-40GB"))})
    current = stored(first.create[0])
    assert [d["name"] for d in current["spec"]["devices"]] == ["gpu-0"]
    same = dra.plan([a100("gpu-a100-0")], [current], {"gpu-a100-0": node_state(
        gpu_state(0, enabled=False, product="NVIDIA A100-SXM4-40GB"))})
    assert same.update == [] and same.create == [] and same.delete == []
    split = dra.plan([a100("gpu-a100-0")], [current], {"gpu-a100-0": node_state(
        gpu_state(0, "7g.40gb", product="NVIDIA A100-SXM4-40GB"))})
    [body] = split.update
    assert [d["name"] for d in body["spec"]["devices"]] == ["gpu-0-mig-7g40gb-0-0"]
    assert body["spec"]["pool"]["generation"] == 2


def test_a_container_that_is_down_or_unreadable_keeps_its_slice():
    current = stored(dra.plan([a100("gpu-a100-0")], []).create[0])
    podman = FakePodman({"gpu-a100-0": "exited", "gpu-a100-1": "running"},
                        {"gpu-a100-1": (1, "nvidia-smi: NVML not initialised")})
    states = dpd.NodeMigStates(dpd.PodmanMigReader(runner=podman), refresh_s=0)
    nodes = [a100("gpu-a100-0"), a100("gpu-a100-1")]
    todo = dra.plan(nodes, [current], states.current(["gpu-a100-0", "gpu-a100-1"]))
    assert todo.create == [] and todo.update == [] and todo.delete == [] and todo.errors == {}
    assert not any(call[1:3] == ["exec", "gpu-a100-0"] for call in podman.calls)  # a stopped container is not exec'd


def test_a_mig_enabled_gpu_without_mig_devices_publishes_nothing():
    todo = dra.plan([a100("gpu-a100-0")], [], {"gpu-a100-0": node_state(
        gpu_state(0, product="NVIDIA A100-SXM4-40GB"), gpu_state(1, enabled=False, product="NVIDIA A100-SXM4-40GB"))})
    assert [d["name"] for d in todo.create[0]["spec"]["devices"]] == ["gpu-1"]


def test_reconcile_reads_only_dra_mode_gpu_nodes_from_their_containers():
    podman = FakePodman({"gpu-a100-0": "running", "gpu-h100-0": "running"}, {"gpu-a100-0": (0, A100_ANSWER)})
    core, resource = FakeCoreApi([a100("gpu-a100-0"), node("gpu-h100-0", dra_mode=False)]), FakeResourceApi([])
    result = dra.reconcile_once(core, resource, mig_states=dpd.NodeMigStates(dpd.PodmanMigReader(runner=podman), 0))
    assert result.created == 1 and list(resource.slices) == ["gpu-a100-0-gpu.nvidia.com"]
    assert len(resource.slices["gpu-a100-0-gpu.nvidia.com"]["spec"]["devices"]) == 4
    assert [call[2] for call in podman.calls if call[1] == "exec"] == ["gpu-a100-0"]


def test_the_command_line_takes_the_device_plugin_doubles_options(monkeypatch):
    seen = {}
    monkeypatch.setattr(dra, "run", lambda *args: seen.setdefault("args", args) and 0)
    dra.main(["--no-node-containers", "--once"])
    assert seen["args"][-1] is None
    seen.clear()
    dra.main(["--mig-refresh", "3", "--once"])
    assert seen["args"][-1] == 3.0
    assert dra.main(["--mig-refresh", "-1"]) == 2
