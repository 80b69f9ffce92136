#!/usr/bin/env python3
"""Lab DOUBLE of NVIDIA's DRA driver for GPUs (kubernetes-sigs/dra-driver-nvidia-gpu, formerly
NVIDIA/k8s-dra-driver-gpu), its GPU kubelet plugin's ResourceSlice publishing only. For the lab only.

The lab's GPU nodes are kwok nodes: no kubelet, no GPU, no kubelet plugin. On a real cluster the driver's kubelet
plugin runs on every node its DaemonSet selects and publishes the node's GPUs as one ResourceSlice pool named after the
node; kube-scheduler allocates ResourceClaims from those slices. This process stands in for the kubelet plugins: for
every simulated GPU node in DRA mode it publishes the `resource.k8s.io/v1` ResourceSlice the real plugin would, and
it deletes the slices of nodes that left DRA mode (or the cluster). Allocation stays with the real kube-scheduler and
claims from templates with the real kube-controller-manager; nothing here prepares devices (kwok runs no containers).

DRA mode: the node label `nvidia.com/gpu.deploy.dra-driver=true`, which the nvidia_dra_driver role sets on the nodes
whose allocation mode is `dra` (and the real kubelet plugin DaemonSet selects). The device-plugin double withdraws
`nvidia.com/gpu` from those nodes, so the two never serve the same GPUs.

What a device looks like (SOURCES: kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/deviceinfo.go,
GpuInfo.CanonicalName / GpuInfo.Attributes / GetDevice, and partitions.go fullGpuCapacity; the same names and types in
NVIDIA/k8s-dra-driver-gpu's deviceinfo.go before the move):

* name `gpu-<minor>` (the double uses the GPU index as the minor number, as on a host whose device nodes follow
  the enumeration order);
* attributes, unqualified (so CEL reads them as `device.attributes['gpu.nvidia.com'].<name>`): `type` string `gpu`,
  `uuid` string, `productName` string (the NVML name, e.g. "NVIDIA H100 80GB HBM3"), `brand` string,
  `architecture` string (e.g. "Hopper"), `cudaComputeCapability` version, `driverVersion` version,
  `cudaDriverVersion` version (versions as semver, "9.0.0", "565.57.1");
* capacity `memory`: the GPU's memory in bytes (a binary-SI quantity: "81559Mi").

MIG devices (mig.go MigSpecTuple.ToCanonicalName, CommonAttributesMig, CommonCapacitiesMig; MigDeviceInfo.GetDevice
in deviceinfo.go): a MIG-enabled GPU is published as its MIG devices instead of a whole GPU, each named
`gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>`, with `type` `mig`, `uuid`, `parentUUID`,
`profile` and the parent's productName, brand, architecture and versions, and capacity `memory` plus one
`memorySlice<n>` (value 1) per memory slice it occupies. The layout is the node's real MIG state where the node has a
lab node container of the same name (the real plugin reads NVML on its node): the device-plugin double's reader
(PodmanMigReader / NodeMigStates: one `podman exec <node> nvidia-smi ... -L` per node, at most every --mig-refresh
seconds), GPU by GPU, so GPUs of one node may differ; while such a container is down or its answer cannot be read,
the node's slice is left as it is. For kwok-only nodes (or with --no-node-containers) the layout comes from the node
label `nvidia.com/mig.config` as the device-plugin double reads it (mig-parted's `all-*` names). Either way the MIG
devices are placed with the project's MIG tables (plugins/module_utils/mig_profiles.py: GI profile ids and placements
from NVIDIA's MIG user guide); `nvidia-smi -L` names profiles, not placements.

The double's own guesses and choices, all marked as such:

* `index` (int): not published by the driver versions read above (the index is only in the device name); the issue
  asks for it, so the double adds it. Selectors meant for real clusters should not rely on it.
* `brand`: NVML's brand of the recorded products is not in the lab's records; the double writes "Nvidia" (go-nvlib's
  string for NVML_BRAND_NVIDIA) for every product.
* UUIDs: the nvidia-smi double's formula (sha256 of gpu-lab/<node>/<index>/uuid), so a node container and its slice
  name the same GPU.
* driver and CUDA driver versions: the nvidia-smi double's recorded default for the product (see PRODUCTS), or the
  node annotation gpu-lab.dev/driver-version when set.
* Not published: PCI bus id and PCIe root (`resource.kubernetes.io/pciBusID`, `resource.kubernetes.io/pcieRoot`),
  NUMA node, addressingMode; for MIG devices the engine capacities (`multiprocessors`, `copyEngines`, `decoders`,
  `encoders`, `jpegEngines`, `ofaEngines`), which come from NVML's profile info.
* MIG `memory`: the profile name's nominal size (1g.10gb -> 10240Mi); NVML reports slightly less. MIG UUIDs: the
  double's own (sha256 of node, GPU index and placement), also for node containers (the device-plugin double's reader
  keeps the profiles of `nvidia-smi -L`, not its MIG UUIDs). MIG placements: the project's tables' first fit of the
  GPU's profiles, not necessarily where the node's instances sit. `index` is added to MIG devices too (the parent
  GPU's index). A MIG-enabled GPU without MIG devices publishes no device.
* The double's guard against serving a GPU twice while a node switches to DRA mode: it publishes a node's first
  slice only once the node no longer shows `nvidia.com/gpu` (the device-plugin double withdraws it on the label).
  The real plugin does not wait; on a real cluster the device plugin's pod is gone before the label that places the
  kubelet plugin is set (the device plugin role runs first in playbooks/cluster.yml).
* One slice per node (pool.resourceSliceCount 1), named `<node>-gpu.nvidia.com` (the real plugin uses generateName);
  the pool generation is raised whenever the slice's content changes, as the kubelet plugin helper does.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import logging
import re
import signal
import sys
import threading
from typing import Any, Iterable, Mapping

from device_plugin_double import (KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE, GPU_ANNOTATIONS, GpuHardware, GpuLayout,
                                  MigLayoutError, NodeMigState, NodeMigStates, PodmanMigReader,
                                  hardware_from_annotations, layout_from_label, layout_from_state, mig_profiles)

LOG = logging.getLogger("dra-driver-double")

DRIVER = "gpu.nvidia.com"
RESOURCE_API = "resource.k8s.io/v1"
DRA_MODE_LABEL = "nvidia.com/gpu.deploy.dra-driver"
DRIVER_VERSION_ANNOTATION = "gpu-lab.dev/driver-version"
# On every slice the double writes: lets it find (and only touch) its own slices, and tells whoever lists slices
# in the lab that a double wrote them.
OWNER_LABEL = "gpu-lab.dev/dra-driver-double"
CONTENT_HASH_ANNOTATION = "gpu-lab.dev/content-hash"
BRAND = "Nvidia"


@dataclasses.dataclass(frozen=True)
class ProductFacts:
    """What NVML says about a product that the lab's node annotations do not carry."""

    architecture: str
    compute_capability: str
    driver_version: str
    cuda_driver_version: str


# The nvidia-smi double's recorded products (lab/doubles/nvidia-smi CATALOGUE: architecture, compute capability,
# default driver and CUDA version as recorded from real GPUs). A product not listed gets UNKNOWN_PRODUCT.
PRODUCTS: Mapping[str, ProductFacts] = {
    "NVIDIA H100 80GB HBM3": ProductFacts("Hopper", "9.0", "565.57.01", "12.7"),
    "NVIDIA H200": ProductFacts("Hopper", "9.0", "570.86.15", "12.8"),
    "NVIDIA A100-SXM4-40GB": ProductFacts("Ampere", "8.0", "580.126.09", "13.0"),
    "NVIDIA A100-SXM4-80GB": ProductFacts("Ampere", "8.0", "535.54.03", "12.2"),
    "Tesla T4": ProductFacts("Turing", "7.5", "515.105.01", "11.7"),
    "NVIDIA L4": ProductFacts("Ada Lovelace", "8.9", "550.90.07", "12.4"),
}
UNKNOWN_PRODUCT = ProductFacts("Unknown", "0.0", "535.261.03", "12.2")  # the nvidia-smi double's fallback driver


def semver(version: str) -> str:
    """The driver's semver.MustParse(...).String(): three numeric parts, leading zeros dropped ("565.57.01" ->
    "565.57.1", "9.0" -> "9.0.0")."""
    parts = [str(int(part)) for part in version.strip().split(".")]
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"{version!r} is not a version of one to three numbers")
    return ".".join(parts + ["0"] * (3 - len(parts)))


def gpu_uuid(node: str, index: int) -> str:
    """The nvidia-smi double's UUID for GPU `index` of `node` (same formula, so both doubles name the same GPU)."""
    digest = hashlib.sha256(f"gpu-lab/{node}/{index}/uuid".encode()).hexdigest()
    return f"GPU-{digest[0:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def in_dra_mode(labels: Mapping[str, str] | None) -> bool:
    return (labels or {}).get(DRA_MODE_LABEL) == "true"


def mig_uuid(node: str, index: int, start: int) -> str:
    """A MIG device's UUID (the double's: stable per node, GPU and placement)."""
    digest = hashlib.sha256(f"gpu-lab/{node}/{index}/mig/{start}/uuid".encode()).hexdigest()
    return f"MIG-{digest[0:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


@functools.lru_cache(maxsize=4096)
def mig_device_name(index: int, profile: str, profile_id: int, start: int) -> str:
    """The driver's MigSpecTuple.ToCanonicalName: gpu-<minor>-mig-<profile without dots, RFC 1123>-<GI profile id>-
    <placement start>, e.g. gpu-0-mig-1g10gb-19-0."""
    cleaned = re.sub(r"[^a-z0-9-.]", "-", profile.replace(".", "").lower()).strip("-")
    return f"gpu-{index}-mig-{cleaned}-{profile_id}-{start}"


@functools.lru_cache(maxsize=256)
def _common_attributes(hardware: GpuHardware, facts: ProductFacts, driver: str) -> dict[str, dict[str, Any]]:
    """Shared by every device of a product and driver (read only: the devices' dicts are serialised, never edited)."""
    return {
        "productName": {"string": hardware.product},
        "brand": {"string": BRAND},
        "architecture": {"string": facts.architecture},
        "cudaComputeCapability": {"version": semver(facts.compute_capability)},
        "driverVersion": {"version": semver(driver)},
        "cudaDriverVersion": {"version": semver(facts.cuda_driver_version)},
    }


@functools.lru_cache(maxsize=256)
def _placements(product: str, devices_per_gpu: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...] | None:
    """Where the layout's MIG devices sit on one GPU (a search; the same for every GPU and node of a product)."""
    geometry = mig_profiles.product(product)
    placements = mig_profiles.place(geometry, dict(devices_per_gpu)) if geometry else None
    return tuple(placements) if placements is not None else None


def mig_placements(hardware: GpuHardware, per_gpu: tuple[tuple[str, int], ...], source: str
                   ) -> tuple[tuple[str, int], ...]:
    """Where one GPU's MIG devices (profile, count pairs) sit; MigLayoutError naming the layout's source when the
    project's tables cannot place them on the product."""
    placements = _placements(hardware.product, tuple(sorted(per_gpu)))
    if placements is None:
        raise MigLayoutError(f"{source}: no placement of {dict(per_gpu)} on {hardware.product}")
    return placements


def mig_devices_of_gpu(node: str, index: int, hardware: GpuHardware, per_gpu: tuple[tuple[str, int], ...],
                       source: str, facts: ProductFacts, driver: str) -> list[dict[str, Any]]:
    """The MIG devices of one MIG-enabled GPU, placed as the project's MIG tables place its profiles (the driver
    publishes the MIG devices that exist, named by profile id and placement start)."""
    geometry = mig_profiles.product(hardware.product)
    placements = mig_placements(hardware, per_gpu, source)
    result = []
    for profile_name, start in placements:
        profile = geometry.profile(profile_name)
        capacity = {"memory": {"value": f"{profile.memory_gb * 1024}Mi"}}
        capacity.update({f"memorySlice{slot}": {"value": "1"} for slot in range(start, start + profile.size)})
        result.append({
            "name": mig_device_name(index, profile.name, profile.id, start),
            "attributes": {
                "type": {"string": "mig"},
                "uuid": {"string": mig_uuid(node, index, start)},
                "parentUUID": {"string": gpu_uuid(node, index)},
                "profile": {"string": profile.name},
                "index": {"int": index},
                **_common_attributes(hardware, facts, driver),
            },
            "capacity": capacity,
        })
    return result


def _gpu_mig(layout: GpuLayout | None, index: int) -> tuple[bool, tuple[tuple[str, int], ...]]:
    """GPU `index`'s MIG mode and (profile, count) pairs; a GPU the layout does not list has MIG off."""
    if layout is None or index >= len(layout.gpus):
        return False, ()
    return layout.gpus[index]


def devices(node: str, hardware: GpuHardware, driver_version: str | None = None,
            layout: GpuLayout | None = None) -> list[dict[str, Any]]:
    """The node's GPUs as the kubelet plugin lists them in its ResourceSlice (see the module doc for the names): a
    whole-GPU device per GPU, or for a GPU with MIG enabled (layout, GPU by GPU) its MIG devices instead."""
    facts = PRODUCTS.get(hardware.product, UNKNOWN_PRODUCT)
    driver = driver_version or facts.driver_version
    result = []
    for index in range(hardware.count):
        enabled, per_gpu = _gpu_mig(layout, index)
        if enabled:
            if per_gpu:
                result.extend(mig_devices_of_gpu(node, index, hardware, per_gpu, layout.source, facts, driver))
            continue
        result.append({
            "name": f"gpu-{index}",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": gpu_uuid(node, index)},
                "index": {"int": index},
                **_common_attributes(hardware, facts, driver),
            },
            "capacity": {"memory": {"value": f"{hardware.memory_mib}Mi"}},
        })
    return result


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


# Raise when the devices built from the same inputs change (a new attribute, a renamed device): every slice is then
# rewritten once.
SLICE_FORMAT = 2


def content_hash(node: str, hardware: GpuHardware, driver_version: str | None, layout: GpuLayout | None) -> str:
    """What a slice's devices are built from: a steady pass compares this, without building any device."""
    layout_key = None if layout is None or not layout.any_enabled else [
        [enabled, [list(pair) for pair in per_gpu]] for enabled, per_gpu in layout.gpus]
    inputs = [SLICE_FORMAT, node, dataclasses.astuple(hardware), driver_version, layout_key]
    return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16]


def desired_slice(node: str, hardware: GpuHardware, generation: int = 1,
                  driver_version: str | None = None, layout: GpuLayout | None = None) -> dict[str, Any]:
    """The ResourceSlice the kubelet plugin would publish for the node (pool = node name, one slice in the pool)."""
    device_list = devices(node, hardware, driver_version, layout)
    return {
        "apiVersion": RESOURCE_API, "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node), "labels": {OWNER_LABEL: "true"},
                     "annotations": {CONTENT_HASH_ANNOTATION: content_hash(node, hardware, driver_version, layout)}},
        "spec": {
            "driver": DRIVER, "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": device_list,
        },
    }


# --- What to change: pure ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Plan:
    create: list[dict[str, Any]]
    update: list[dict[str, Any]]  # full objects with metadata.resourceVersion of the slice they replace
    delete: list[str]
    errors: dict[str, str]


Wanted = tuple[GpuHardware, "str | None", GpuLayout]


def is_dra_gpu_node(node: Mapping[str, Any]) -> bool:
    """A simulated (kwok) node with GPU annotations, in DRA mode: one the double publishes a slice for."""
    metadata = node.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    return annotations.get(KWOK_NODE_ANNOTATION) == KWOK_NODE_VALUE and in_dra_mode(metadata.get("labels")) \
        and any(key in annotations for key in GPU_ANNOTATIONS)


def wanted_nodes(nodes: Iterable[Mapping[str, Any]], mig_states: Mapping[str, NodeMigState | None] | None = None
                 ) -> tuple[dict[str, Wanted], dict[str, str], set[str]]:
    """Simulated GPU nodes in DRA mode -> (hardware, driver version override, MIG layout); nodes whose GPU
    annotations, driver version or MIG layout are broken -> the reason (no slice for them); and nodes to leave as
    they are (a lab node container that is down or whose nvidia-smi could not be read).

    `mig_states` (NodeMigStates.current): a node listed there takes its GPU count and MIG layout from its node
    container's nvidia-smi; the others from their annotations and nvidia.com/mig.config label."""
    wanted: dict[str, Wanted] = {}
    errors: dict[str, str] = {}
    untouched: set[str] = set()
    for node in nodes:
        metadata = node.get("metadata") or {}
        annotations = metadata.get("annotations") or {}
        name = metadata.get("name", "")
        if annotations.get(KWOK_NODE_ANNOTATION) != KWOK_NODE_VALUE or not in_dra_mode(metadata.get("labels")):
            continue
        try:
            hardware = hardware_from_annotations(annotations)
        except ValueError as error:
            errors[name] = str(error)
            continue
        if hardware is None:
            continue
        driver_version = annotations.get(DRIVER_VERSION_ANNOTATION) or None
        try:
            semver(driver_version or "0")
        except ValueError as error:
            errors[name] = f"{DRIVER_VERSION_ANNOTATION}={driver_version!r}: {error}"
            continue
        try:
            if mig_states is not None and name in mig_states:
                state = mig_states[name]
                if state is None:
                    untouched.add(name)
                    continue
                hardware = dataclasses.replace(hardware, count=len(state.gpus))
                layout = layout_from_state(state)
            else:
                layout = layout_from_label(hardware, metadata.get("labels") or {})
            for enabled, per_gpu in layout.gpus:
                if enabled and per_gpu:
                    mig_placements(hardware, per_gpu, layout.source)  # a layout that cannot be placed fails here
        except MigLayoutError as error:
            errors[name] = str(error)
            continue
        wanted[name] = (hardware, driver_version, layout)
    return wanted, errors, untouched


def device_plugin_advertises(node: Mapping[str, Any]) -> bool:
    """The node still shows the device plugin's nvidia.com/gpu (the device-plugin double withdraws it a pass after
    the mode label appears)."""
    allocatable = ((node.get("status") or {}).get("allocatable") or {})
    return str(allocatable.get("nvidia.com/gpu", "0")) not in ("0", "")


def plan(nodes: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]],
         mig_states: Mapping[str, NodeMigState | None] | None = None) -> Plan:
    """Slices to create, replace and delete so that exactly the DRA-mode GPU nodes have the slice they should.
    `slices` are the double's own (label OWNER_LABEL); a slice whose content hash (of the inputs its devices are
    built from) matches is left alone without building any device, so a steady pass over a thousand nodes is cheap.
    A node whose container could not be read (None in `mig_states`) keeps its slice as it is."""
    nodes = list(nodes)
    wanted, errors, untouched = wanted_nodes(nodes, mig_states)
    still_advertised = {node["metadata"]["name"] for node in nodes if device_plugin_advertises(node)}
    existing = {item["metadata"]["name"]: item for item in slices}
    create, update = [], []
    for node, (hardware, driver_version, layout) in sorted(wanted.items()):
        current = existing.get(slice_name(node))
        if current is None:
            if node in still_advertised:
                continue  # the double's guard: publish once the device plugin's resources are gone
            create.append(desired_slice(node, hardware, 1, driver_version, layout))
            continue
        generation = int(((current.get("spec") or {}).get("pool") or {}).get("generation") or 0)
        current_hash = ((current["metadata"].get("annotations") or {}).get(CONTENT_HASH_ANNOTATION))
        if current_hash != content_hash(node, hardware, driver_version, layout) \
                or (current.get("spec") or {}).get("nodeName") != node:
            target = desired_slice(node, hardware, generation + 1, driver_version, layout)
            target["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion")
            update.append(target)
    keep = {slice_name(node) for node in wanted} | {slice_name(node) for node in untouched}
    delete = sorted(name for name in existing if name not in keep)
    return Plan(create=create, update=update, delete=delete, errors=errors)


# --- I/O -----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ReconcileResult:
    nodes: int = 0
    created: int = 0
    updated: int = 0
    deleted: int = 0
    errors: dict[str, str] = dataclasses.field(default_factory=dict)


def _json(response: Any) -> dict[str, Any]:
    data = getattr(response, "data", response)
    release = getattr(response, "release_conn", None)
    if callable(release):
        release()
    return json.loads(data) if isinstance(data, (bytes, str)) else dict(data)


def reconcile_once(core: Any, resource: Any, workers: int = 8, mig_states: NodeMigStates | None = None
                   ) -> ReconcileResult:
    """One pass: one LIST of nodes, one LIST of the double's slices, then a write per slice that differs. With
    `mig_states`, DRA-mode GPU nodes that have a lab node container take their MIG layout from its nvidia-smi."""
    nodes = _json(core.list_node(_preload_content=False)).get("items") or []
    slices = _json(resource.list_resource_slice(label_selector=OWNER_LABEL, _preload_content=False)).get("items") or []
    readings = mig_states.current((node.get("metadata") or {}).get("name", "") for node in nodes
                                  if is_dra_gpu_node(node)) if mig_states is not None else None
    todo = plan(nodes, slices, readings)
    result = ReconcileResult(nodes=len(nodes), errors=dict(todo.errors))

    def create(body: dict[str, Any]) -> tuple[str, str, str | None]:
        try:
            _json(resource.create_resource_slice(body, _preload_content=False))
        except Exception as error:  # one failure must not stop the pass; the next pass retries
            return "create", body["metadata"]["name"], str(error)
        return "create", body["metadata"]["name"], None

    def update(body: dict[str, Any]) -> tuple[str, str, str | None]:
        try:
            _json(resource.replace_resource_slice(body["metadata"]["name"], body, _preload_content=False))
        except Exception as error:
            return "update", body["metadata"]["name"], str(error)
        return "update", body["metadata"]["name"], None

    def delete(name: str) -> tuple[str, str, str | None]:
        try:
            _json(resource.delete_resource_slice(name, _preload_content=False))
        except Exception as error:
            return "delete", name, None if getattr(error, "status", None) == 404 else str(error)
        return "delete", name, None

    jobs = [(create, body) for body in todo.create] + [(update, body) for body in todo.update] \
        + [(delete, name) for name in todo.delete]
    if not jobs:
        return result
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        outcomes = list(pool.map(lambda job: job[0](job[1]), jobs))
    for verb, name, failure in outcomes:
        if failure is not None:
            LOG.warning("%s ResourceSlice %s failed: %s", verb, name, failure)
            result.errors[name] = failure
            continue
        LOG.info("%s ResourceSlice %s", {"create": "created", "update": "updated", "delete": "deleted"}[verb], name)
        setattr(result, verb + "d", getattr(result, verb + "d") + 1)
    for node, error in todo.errors.items():
        LOG.warning("%s: no ResourceSlice: %s", node, error)
    return result


def run(kubeconfig: str | None, interval_s: float = 2.0, once: bool = False, stop: threading.Event | None = None,
        workers: int = 8, mig_refresh_s: float | None = 10.0) -> int:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 1, workers)
    api_client = client.ApiClient(configuration)
    core, resource = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    stop = stop or threading.Event()
    mig_states = NodeMigStates(PodmanMigReader(), mig_refresh_s) if mig_refresh_s is not None else None
    while True:
        try:
            reconcile_once(core, resource, workers, mig_states)
        except Exception as error:  # the API server may be restarting; the next pass retries
            LOG.error("reconcile pass failed: %s", error)
            if once:
                return 1
        if once or stop.wait(interval_s):
            return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dra_driver_double.py",
        description="Lab DOUBLE of NVIDIA's DRA driver for GPUs (its kubelet plugin's ResourceSlices), for the lab "
                    f"only: publishes a {RESOURCE_API} ResourceSlice (driver {DRIVER}) for every simulated GPU node "
                    f"labelled {DRA_MODE_LABEL}=true and deletes the slices of other nodes. Never run it against a "
                    "real cluster.")
    parser.add_argument("--kubeconfig", help="kubeconfig of the lab cluster (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between passes (default 2)")
    parser.add_argument("--workers", type=int, default=8, help="concurrent writes in a pass (default 8)")
    parser.add_argument("--mig-refresh", type=float, default=10.0,
                        help="seconds between reads of the lab node containers' nvidia-smi MIG state (default 10)")
    parser.add_argument("--no-node-containers", action="store_true",
                        help="take every node's MIG layout from its nvidia.com/mig.config label, never from a lab "
                             "node container")
    parser.add_argument("--once", action="store_true", help="run one pass and exit")
    args = parser.parse_args(argv)
    if args.interval <= 0 or args.workers < 1 or args.mig_refresh < 0:
        print("dra_driver_double.py: --interval must be > 0, --workers >= 1 and --mig-refresh >= 0", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s dra-driver-double: %(message)s")
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        LOG.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    return run(args.kubeconfig, args.interval, args.once, stop, args.workers,
               None if args.no_node_containers else args.mig_refresh)


if __name__ == "__main__":
    sys.exit(main())
