"""Benchmark: scheduling latency of GPU pods asking through a ResourceClaim (DRA) against the same pods asking for the
nvidia.com/gpu extended resource (device plugin), on one lab of --nodes simulated nodes (default 1000), same run.

A measurement, not a test: it prints figures and fails only if the lab, the role or the scheduler fails. It starts a
separate lab (state in /var/lib/gpu-lab-bench-dra, every port shifted by --port-offset) whose GPU nodes are split into
two equal groups of 8-GPU H100 nodes, plus 10 % CPU-only nodes. The nvidia_dra_driver role (the project's own, with
one group in the inventory at nvidia_dra_driver_allocation_mode=dra) labels the DRA group and applies the DeviceClasses;
the lab's DRA-driver double then publishes a ResourceSlice per DRA node and the device-plugin double withdraws
nvidia.com/gpu from them, so each GPU is served one way only. The real kube-scheduler places both kinds; the real
kube-controller-manager creates each pod's ResourceClaim from its ResourceClaimTemplate. Usage (as root, after
`make lab-build`):
    .venv/bin/python bench/dra_latency.py [--nodes 1000] [--sequential 100] [--burst 300]

Pods ask for 1, 2, 4 or 8 GPUs in turn; a claim pod's template asks for the same count of `gpu.nvidia.com` devices
(allocationMode ExactCount). Times are taken on the bench's side from the pod's create call returning to a watch
event showing spec.nodeName (one watch for pods, one for claims, started before the pods), so both modes pay the same
client and watch overhead. Printed per mode:
  1. sequential: one pod at a time (the next one is created once the previous is bound), modes alternating, latency
     p50 / p95 / max;
  2. burst: --burst pods created at once from 16 threads (one mode after the other), pods bound per second (from the
     first create call to the last pod bound) and the latency p50 / p95;
  3. for claim pods, where the time goes (sequential phase, medians): pod created -> ResourceClaim created by the
     controller manager -> claim allocated by the scheduler -> pod bound.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))

import benchlab  # noqa: E402
import cluster  # noqa: E402
import config as lab_config  # noqa: E402
from _common import format_seconds  # noqa: E402

NAMESPACE = "dra-bench"
SIZES = (1, 2, 4, 8)
GPUS_PER_NODE = 8
MODE_LABEL = "gpu-lab.dev/dra-bench-mode"
DEVICE_CLASS = "gpu.nvidia.com"
MODES = ("extended-resource", "claim")
POOLS = {"extended-resource": "bench-dp", "claim": "bench-dra"}


def bench_config(nodes: int, port_offset: int) -> lab_config.LabConfig:
    base = lab_config.load()
    gpu = lab_config.GpuSpec("NVIDIA H100 80GB HBM3", GPUS_PER_NODE, 81559, True)
    group = int(nodes * 0.45)
    pools = (lab_config.NodePool(prefix=POOLS["extended-resource"], count=group, host=False, cpu="96", memory="1Ti",
                                 gpu=gpu),
             lab_config.NodePool(prefix=POOLS["claim"], count=group, host=False, cpu="96", memory="1Ti", gpu=gpu),
             lab_config.NodePool(prefix="bench-cpu", count=nodes - 2 * group, host=False, cpu="32", memory="128Gi",
                                 gpu=None))
    ports = {name: port + port_offset for name, port in base.ports.items()}
    return lab_config.LabConfig(ports=ports, service_cidr=base.service_cidr, cluster_name="gpu-lab-bench-dra",
                                device_plugin_double=base.device_plugin_double, pools=pools)


def apply_dra_role(kubeconfig: Path, dra_nodes: list[str]) -> float:
    """The nvidia_dra_driver role with the DRA group in the inventory at allocation mode dra; returns its seconds."""
    return benchlab.run_cluster_roles(
        kubeconfig, "nvidia_dra_driver", "nvidia_dra_driver with allocation mode dra",
        gpu_nodes={"hosts": dict.fromkeys(dra_nodes), "vars": {"nvidia_dra_driver_allocation_mode": "dra"}})


def wait_served(core, resource_api, dra_nodes: list[str], timeout: float = 600) -> float:  # noqa: ANN001
    """Until every DRA node has its ResourceSlice and no longer advertises nvidia.com/gpu."""
    started = time.monotonic()
    wanted = set(dra_nodes)
    while time.monotonic() - started < timeout:
        slices = {item.spec.node_name for item in resource_api.list_resource_slice().items
                  if item.spec.driver == DEVICE_CLASS}
        nodes = core.list_node(label_selector=f"{cluster.DRA_MODE_LABEL}=true").items
        withdrawn = {node.metadata.name for node in nodes if not (node.status.allocatable or {}).get("nvidia.com/gpu")}
        if wanted <= slices and wanted <= withdrawn:
            return time.monotonic() - started
        time.sleep(1)
    raise SystemExit(f"DRA nodes not served after {timeout:.0f} s: {len(wanted - slices)} without a slice, "
                     f"{len(wanted - withdrawn)} still advertising nvidia.com/gpu")


class Recorder:
    """Two watches (pods and ResourceClaims in the bench namespace) noting when each pod was first seen bound, and
    when each pod's claim first appeared and was first seen allocated."""

    def __init__(self, core, resource_api) -> None:  # noqa: ANN001
        self.core, self.resource_api = core, resource_api
        self.bound: dict[str, float] = {}
        self.claim_created: dict[str, float] = {}
        self.claim_allocated: dict[str, float] = {}
        self.changed = threading.Condition()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.watch_pods, daemon=True),
                        threading.Thread(target=self.watch_claims, daemon=True)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def note(self, table: dict[str, float], name: str) -> None:
        with self.changed:
            table.setdefault(name, time.monotonic())
            self.changed.notify_all()

    def watch_pods(self) -> None:
        from kubernetes import watch

        while not self.stop.is_set():
            try:
                for event in watch.Watch().stream(self.core.list_namespaced_pod, NAMESPACE, timeout_seconds=60):
                    pod = event["object"]
                    if pod.spec.node_name:
                        self.note(self.bound, pod.metadata.name)
            except Exception:  # noqa: BLE001 - a broken watch is opened again; at the end the API server goes away
                time.sleep(0.5)

    def watch_claims(self) -> None:
        from kubernetes import watch

        while not self.stop.is_set():
            try:
                # The client names the v1 claim model ResourceV1ResourceClaim; its watch would look for V1ResourceClaim.
                for event in watch.Watch(return_type="ResourceV1ResourceClaim").stream(
                        self.resource_api.list_namespaced_resource_claim, NAMESPACE, timeout_seconds=60):
                    claim = event["object"]
                    owner = next((ref.name for ref in claim.metadata.owner_references or [] if ref.kind == "Pod"),
                                 None)
                    if owner is None:
                        continue
                    self.note(self.claim_created, owner)
                    if claim.status and claim.status.allocation:
                        self.note(self.claim_allocated, owner)
            except Exception:  # noqa: BLE001 - a broken watch is opened again; at the end the API server goes away
                time.sleep(0.5)

    def wait_bound(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not all(name in self.bound for name in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [name for name in names if name not in self.bound]
                    raise SystemExit(f"{len(missing)} pods not bound after {timeout:.0f} s, e.g. {missing[:3]}")
                self.changed.wait(min(left, 1.0))


def pod(name: str, mode: str, gpus: int) -> dict:
    container = {"name": "job", "image": "registry.invalid/train:1",
                 "resources": {"requests": {"cpu": "1", "memory": "4Gi"}}}
    spec = {"nodeSelector": {cluster.POOL_LABEL: POOLS[mode]}, "containers": [container]}
    if mode == "claim":
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": f"gpus-{gpus}"}]
        container["resources"]["claims"] = [{"name": "gpus"}]
    else:
        container["resources"]["requests"]["nvidia.com/gpu"] = str(gpus)
        container["resources"]["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {"metadata": {"name": name, "labels": {MODE_LABEL: mode},
                         "annotations": {cluster.HOLD_RUNNING_ANNOTATION: "true"}}, "spec": spec}


def claim_template(gpus: int) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": f"gpus-{gpus}", "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": gpus}}]}}}}


def create(core, name: str, mode: str, gpus: int) -> float:  # noqa: ANN001
    core.create_namespaced_pod(NAMESPACE, pod(name, mode, gpus))
    return time.monotonic()


def clear(core, resource_api) -> None:  # noqa: ANN001
    """Delete the bench's pods; wait until they and their claims are gone (the GPUs free again)."""
    core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
    deadline = time.monotonic() + 300
    while core.list_namespaced_pod(NAMESPACE).items or resource_api.list_namespaced_resource_claim(NAMESPACE).items:
        if time.monotonic() > deadline:
            raise SystemExit("bench pods or their claims not gone after 300 s")
        time.sleep(0.5)


def quantiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return statistics.median(ordered), p95, ordered[-1]


def ms(value: float) -> str:
    return f"{1000 * value:.0f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--sequential", type=int, default=100, help="pods per mode, one at a time")
    parser.add_argument("--burst", type=int, default=300, help="pods per mode created at once")
    parser.add_argument("--port-offset", type=int, default=2000)
    parser.add_argument("--state", default="/var/lib/gpu-lab-bench-dra")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()
    config = bench_config(args.nodes, args.port_offset)
    paths = benchlab.take_state(args.state, config)
    group = config.pools[0].count
    print(f"bench: {args.nodes} simulated nodes ({group} device-plugin + {group} DRA nodes of {GPUS_PER_NODE} GPUs, "
          f"{config.pools[2].count} CPU-only) on a fresh control plane in {args.state}", flush=True)
    try:
        from kubernetes import client

        started = time.monotonic()
        cluster.control_plane_up(config, build=False, wait_timeout=1800)
        core = cluster.kube_client(paths.admin_kubeconfig)
        resource_api = client.ResourceV1Api(core.api_client)
        print(f"--> bench lab up, nodes Ready, in {format_seconds(time.monotonic() - started)}; applying the "
              "nvidia_dra_driver role", flush=True)
        dra_nodes = [name for name, pool in config.nodes() if pool.prefix == POOLS["claim"]]
        role_s = apply_dra_role(paths.admin_kubeconfig, dra_nodes)
        served_s = wait_served(core, resource_api, dra_nodes)
        print(f"--> role applied in {format_seconds(role_s)}; {len(dra_nodes)} ResourceSlices published and "
              f"nvidia.com/gpu withdrawn {format_seconds(served_s)} later", flush=True)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        for gpus in SIZES:
            resource_api.create_namespaced_resource_claim_template(NAMESPACE, claim_template(gpus))
        recorder = Recorder(core, resource_api)
        recorder.start()
        time.sleep(2)  # the watches are open before the first pod

        sequential: dict[str, list[float]] = {mode: [] for mode in MODES}
        parts: dict[str, list[float]] = {"claim created": [], "claim allocated": [], "pod bound": []}
        print(f"--> sequential: {args.sequential} pods per mode, one at a time, modes alternating", flush=True)
        for index in range(args.sequential):
            gpus = SIZES[index % len(SIZES)]
            for mode in MODES:
                name = f"seq-{mode}-{index}"
                created = create(core, name, mode, gpus)
                recorder.wait_bound([name], timeout=60)
                sequential[mode].append(recorder.bound[name] - created)
                if mode == "claim":
                    claim_at = recorder.claim_created.get(name, created)
                    allocated_at = recorder.claim_allocated.get(name, recorder.bound[name])
                    parts["claim created"].append(claim_at - created)
                    parts["claim allocated"].append(allocated_at - claim_at)
                    parts["pod bound"].append(recorder.bound[name] - allocated_at)
        clear(core, resource_api)

        burst: dict[str, tuple[float, list[float]]] = {}
        for mode in MODES:
            print(f"--> burst: {args.burst} {mode} pods at once", flush=True)
            names = [f"burst-{mode}-{index}" for index in range(args.burst)]
            first = time.monotonic()
            # Created from 16 threads, so that the bench's own POSTs are not what limits the rate.
            with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
                created_at = dict(zip(names, pool.map(
                    lambda item: create(core, item[1], mode, SIZES[item[0] % len(SIZES)]), enumerate(names))))
            recorder.wait_bound(names, timeout=600)
            last = max(recorder.bound[name] for name in names)
            burst[mode] = (args.burst / (last - first), [recorder.bound[name] - created_at[name] for name in names])
            clear(core, resource_api)
        recorder.stop.set()

        rows = [("", *MODES)]
        rows.append(("1. sequential latency p50 / p95 / max",
                     *(" / ".join(ms(value) for value in quantiles(sequential[mode])) for mode in MODES)))
        rows.append((f"2. burst of {args.burst}: pods bound per second", *(f"{burst[mode][0]:.1f}" for mode in MODES)))
        rows.append(("   burst latency p50 / p95",
                     *(" / ".join(ms(value) for value in quantiles(burst[mode][1])[:2]) for mode in MODES)))
        rows.append(("3. claim pods, medians: pod -> claim created -> allocated -> pod bound", "-",
                     " -> ".join(ms(statistics.median(parts[name])) for name in parts)))
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
        print("\n".join("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows),
              flush=True)
        if args.json:
            args.json.write_text(json.dumps({
                "nodes": args.nodes, "gpu_nodes_per_mode": group,
                "sequential": {mode: dict(zip(("p50_s", "p95_s", "max_s"), quantiles(sequential[mode])))
                               for mode in MODES},
                "burst": {mode: {"pods_per_s": burst[mode][0],
                                 **dict(zip(("p50_s", "p95_s"), quantiles(burst[mode][1])[:2]))} for mode in MODES},
                "claim_parts_median_s": {name: statistics.median(values) for name, values in parts.items()},
            }, indent=2) + "\n")
    finally:
        cluster.control_plane_down(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
