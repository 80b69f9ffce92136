"""Benchmark: GPU packing under the default kube-scheduler and under the project's bin-packing profile, side by side.

A measurement, not a test: it prints figures and fails only if the lab or a playbook fails. It starts a separate lab
(state in /var/lib/gpu-lab-bench-packing, every port shifted by --port-offset) with two groups of --nodes simulated
nodes of 8 GPUs, deploys the bin-packing scheduler with the gpu_scheduling role (the lab runs the real kube-scheduler
with what the role applied), and replays one seeded job sequence on each group: the default scheduler's pods on one,
the profile's (schedulerName gpu-binpack) on the other. Usage (as root, after `make lab-build`):
    .venv/bin/python bench/gpu_packing.py [--nodes 16] [--seed 1] [--churn 150] [--resources nvidia.com/gpu=1]
        [--strategy RequestedToCapacityRatio]

Jobs are single pods asking for 1, 2, 4 or 8 GPUs (45/25/15/15 %), each with a duration drawn from the same seeded
distribution. Each job is submitted once the previous one is placed or refused (the scheduler's Unschedulable
condition; a refused job is deleted, its GPUs count as demand that found no place). Printed per scheduler:
  1. GPUs allocated when the first 8-GPU job cannot be placed (no job completes in this fill phase, which goes on
     past 100 % demand until one is refused);
  2. GPUs left unallocated when the submitted demand reaches 100 % of the GPUs;
  3. nodes with all 8 GPUs free when the submitted demand reaches 75 %;
  4. scheduling throughput: a burst of 1-GPU pods created at once, pods bound per second;
and, with --churn N, N more jobs in a steady state where jobs complete after their duration (the bench deletes a
pod when its simulated time is up, as a finished job frees its GPUs): the share of 8-GPU jobs placed and the mean
allocation. A last column gives figures 1-3 of an ideal online best-fit on the same sequence (simulated, no
scheduler): the bound a GPU-count packing reaches. Published reference (FGD, USENIX ATC '23, unallocated GPUs at full
demand): random 13.8 %, packing 8.2 %, best-fit 7.1 %, FGD 4.8 %.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))

import benchlab  # noqa: E402
import cluster  # noqa: E402
import config as lab_config  # noqa: E402
from _common import format_seconds  # noqa: E402

SIZES = (1, 2, 4, 8)
WEIGHTS = (45, 25, 15, 15)
GPUS_PER_NODE = 8
SCHEDULERS = {"default": None, "binpack": "gpu-binpack"}
GROUP_LABEL = "gpu-lab.dev/packing-group"
NAMESPACE = "packing-bench"


@dataclasses.dataclass
class Job:
    index: int
    gpus: int
    duration: int  # in jobs submitted: a job completes once this many later jobs have arrived


@dataclasses.dataclass
class Figures:
    allocation_at_first_8gpu_failure: float | None = None
    unallocated_at_full_demand: float | None = None
    free_nodes_at_75: int | None = None
    burst_pods_per_s: float | None = None
    churn_8gpu_placed: str = "-"
    churn_mean_allocation: float | None = None
    placed: int = 0
    refused: int = 0


MEAN_GPUS = sum(size * weight for size, weight in zip(SIZES, WEIGHTS)) / sum(WEIGHTS)  # 2.75
OFFERED_LOAD = 0.9  # the steady state's demand: GPUs its running jobs would hold, over the GPUs there are


def jobs(seed: int, count: int, capacity: int) -> list[Job]:
    """The seeded sequence. Durations (in arrivals) are exponential, most jobs short and some long, the same for every
    size, with a mean that offers OFFERED_LOAD of the GPUs in the steady state (Little's law: mean GPUs x mean
    duration = load x capacity)."""
    rng = random.Random(seed)
    mean = OFFERED_LOAD * capacity / MEAN_GPUS
    return [Job(index, rng.choices(SIZES, WEIGHTS)[0], max(1, int(rng.expovariate(1 / mean)))) for index in range(count)]


def bench_config(nodes: int, port_offset: int) -> lab_config.LabConfig:
    base = lab_config.load()
    gpu = lab_config.GpuSpec("NVIDIA H100 80GB HBM3", GPUS_PER_NODE, 81559, True)
    pools = tuple(lab_config.NodePool(prefix=f"pack-{group}", count=nodes, host=False, cpu="96", memory="1Ti", gpu=gpu)
                  for group in SCHEDULERS)
    ports = {name: port + port_offset for name, port in base.ports.items()}
    return lab_config.LabConfig(ports=ports, service_cidr=base.service_cidr, cluster_name="gpu-lab-bench-packing",
                                device_plugin_double=base.device_plugin_double, pools=pools)


class Group:
    """One scheduler's nodes and the pods placed on them."""

    def __init__(self, core, name: str, scheduler: str | None, nodes: int) -> None:
        self.core, self.name, self.scheduler = core, name, scheduler
        self.capacity = nodes * GPUS_PER_NODE
        self.node_names = [f"pack-{name}-{index}" for index in range(nodes)]
        self.running: dict[str, tuple[str, int, int]] = {}  # pod -> (node, gpus, end)
        self.figures = Figures()

    @property
    def allocated(self) -> int:
        return sum(gpus for _, gpus, _ in self.running.values())

    def free_nodes(self) -> int:
        used = {node for node, _, _ in self.running.values()}
        return sum(1 for node in self.node_names if node not in used)

    def pod(self, name: str, gpus: int) -> dict:
        spec = {"nodeSelector": {"gpu-lab.dev/pool": f"pack-{self.name}"},
                "containers": [{"name": "job", "image": "registry.invalid/train:1", "resources": {
                    "requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": str(gpus)},
                    "limits": {"nvidia.com/gpu": str(gpus)}}}]}
        if self.scheduler:
            spec["schedulerName"] = self.scheduler
        return {"metadata": {"name": name, "labels": {GROUP_LABEL: self.name},
                             "annotations": {cluster.HOLD_RUNNING_ANNOTATION: "true"}}, "spec": spec}

    def submit(self, name: str, gpus: int, end: int) -> bool:
        """Create the pod and wait for the scheduler's answer: True placed, False refused (then deleted)."""
        self.core.create_namespaced_pod(NAMESPACE, self.pod(name, gpus))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pod = self.core.read_namespaced_pod(name, NAMESPACE)
            if pod.spec.node_name:
                self.running[name] = (pod.spec.node_name, gpus, end)
                self.figures.placed += 1
                return True
            if any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
                   for c in pod.status.conditions or []):
                self.delete(name)
                self.figures.refused += 1
                return False
            time.sleep(0.02)
        raise SystemExit(f"{name}: no answer from {self.scheduler or 'default-scheduler'} in 60 s")

    def delete(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
        self.running.pop(name, None)

    def complete(self, now: int) -> None:
        for name in [name for name, (_, _, end) in self.running.items() if end <= now]:
            self.delete(name)

    def clear(self) -> None:
        for name in list(self.running):
            self.delete(name)
        wait_gone(self.core, f"{GROUP_LABEL}={self.name}")


def wait_gone(core, selector: str) -> None:
    deadline = time.monotonic() + 120
    while core.list_namespaced_pod(NAMESPACE, label_selector=selector).items:
        if time.monotonic() > deadline:
            raise SystemExit(f"pods {selector} not gone after 120 s")
        time.sleep(0.2)


def fill(group: Group, sequence: list[Job]) -> None:
    """No job completes: submit until the demand reaches 100 % of the group's GPUs and an 8-GPU job has been refused
    (or the sequence ends: the allocation at the first refused 8-GPU job is then not reached)."""
    demand = 0
    for job in sequence:
        placed = group.submit(f"{group.name}-fill-{job.index}", job.gpus, end=10**9)
        demand += job.gpus
        if job.gpus == 8 and not placed and group.figures.allocation_at_first_8gpu_failure is None:
            group.figures.allocation_at_first_8gpu_failure = group.allocated / group.capacity
        if demand >= 0.75 * group.capacity and group.figures.free_nodes_at_75 is None:
            group.figures.free_nodes_at_75 = group.free_nodes()
        if demand >= group.capacity and group.figures.unallocated_at_full_demand is None:
            group.figures.unallocated_at_full_demand = 1 - group.allocated / group.capacity
        if group.figures.unallocated_at_full_demand is not None and group.figures.allocation_at_first_8gpu_failure is not None:
            return


def best_fit_bound(sequence: list[Job], nodes: int) -> tuple[float | None, float | None, int | None]:
    """Figures 1-3 of the fill phase for an ideal online best-fit (each job on the node it leaves fullest, no
    scheduler, exact arithmetic): the reference the profile is measured against. A placement that knows only the jobs
    so far does no better on GPU count alone; doing better needs fragmentation-aware scoring (FGD) or look-ahead."""
    capacity = nodes * GPUS_PER_NODE
    free = [GPUS_PER_NODE] * nodes
    allocated = demand = 0
    first: float | None = None
    full: float | None = None
    free_at_75: int | None = None
    for job in sequence:
        fits = [index for index in range(nodes) if free[index] >= job.gpus]
        if fits:
            chosen = min(fits, key=lambda index: (free[index] - job.gpus, index))
            free[chosen] -= job.gpus
            allocated += job.gpus
        demand += job.gpus
        if job.gpus == GPUS_PER_NODE and not fits and first is None:
            first = allocated / capacity
        if demand >= 0.75 * capacity and free_at_75 is None:
            free_at_75 = sum(1 for left in free if left == GPUS_PER_NODE)
        if demand >= capacity and full is None:
            full = 1 - allocated / capacity
        if first is not None and full is not None:
            break
    return first, full, free_at_75


def churn(group: Group, sequence: list[Job], steady: int) -> None:
    """Jobs complete after their duration (counted in arrivals); the first `steady` arrivals only warm up."""
    eights, eights_placed, allocation = 0, 0, []
    for step, job in enumerate(sequence):
        group.complete(step)
        placed = group.submit(f"{group.name}-churn-{job.index}", job.gpus, end=step + job.duration)
        if step >= steady:
            allocation.append(group.allocated / group.capacity)
            if job.gpus == 8:
                eights += 1
                eights_placed += placed
    group.figures.churn_8gpu_placed = f"{eights_placed}/{eights}" if eights else "-"
    group.figures.churn_mean_allocation = sum(allocation) / len(allocation) if allocation else None


def burst(group: Group, count: int) -> None:
    """`count` 1-GPU pods created at once: pods bound per second until the last is bound."""
    names = [f"{group.name}-burst-{index}" for index in range(count)]
    started = time.monotonic()
    for name in names:
        group.core.create_namespaced_pod(NAMESPACE, group.pod(name, 1))
    while True:
        pods = group.core.list_namespaced_pod(NAMESPACE, label_selector=f"{GROUP_LABEL}={group.name}").items
        bound = [pod for pod in pods if pod.metadata.name in names and pod.spec.node_name]
        if len(bound) == count:
            break
        if time.monotonic() - started > 300:
            raise SystemExit(f"burst on {group.name}: {len(bound)} of {count} bound after 300 s")
        time.sleep(0.05)
    group.figures.burst_pods_per_s = count / (time.monotonic() - started)
    for name in names:
        group.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
    wait_gone(group.core, f"{GROUP_LABEL}={group.name}")


def parse_resources(text: str) -> list[dict]:
    """--resources "nvidia.com/gpu=10,cpu=1" -> gpu_scheduling_binpack_resources; "" keeps the role's default."""
    resources = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, weight = item.partition("=")
        resources.append({"name": name, "weight": int(weight or 1)})
    return resources


def deploy_binpack(kubeconfig: Path, resources: list[dict], strategy: str) -> None:
    """The gpu_scheduling role with gpu_scheduling_binpack=true against the bench lab (no GPU hosts in the inventory)."""
    settings = {"gpu_scheduling_binpack": True, "gpu_scheduling_runtime_class": False}
    if strategy:
        settings["gpu_scheduling_binpack_strategy"] = strategy
    if resources:
        settings["gpu_scheduling_binpack_resources"] = resources
    benchlab.run_cluster_roles(kubeconfig, "gpu_scheduling_preflight,gpu_scheduling_apply",
                               "gpu_scheduling with gpu_scheduling_binpack=true", extra_vars=settings)


def wait_lease(core_api, name: str) -> None:
    from kubernetes import client

    coordination = client.CoordinationV1Api(core_api.api_client)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if coordination.read_namespaced_lease(name, "kube-system").spec.holder_identity:
                return
        except client.ApiException as error:
            if error.status != 404:
                raise
        time.sleep(0.5)
    raise SystemExit(f"the {name} scheduler did not take its lease in 120 s (see <state>/logs/scheduler-{name}.log)")


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16, help="8-GPU nodes per scheduler (16 to 32)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--churn", type=int, default=150, help="jobs of the steady-state phase (0: skip it)")
    parser.add_argument("--burst", type=int, default=64, help="1-GPU pods of the throughput burst")
    parser.add_argument("--resources", default="", help="weights of the profile, e.g. nvidia.com/gpu=1 (default: the "
                        "role's gpu_scheduling_binpack_resources)")
    parser.add_argument("--strategy", default="", choices=("", "MostAllocated", "RequestedToCapacityRatio"),
                        help="the profile's scoring strategy (default: the role's gpu_scheduling_binpack_strategy)")
    parser.add_argument("--port-offset", type=int, default=3000)
    parser.add_argument("--state", default="/var/lib/gpu-lab-bench-packing")
    args = parser.parse_args()
    config = bench_config(args.nodes, args.port_offset)
    paths = benchlab.take_state(args.state, config)
    capacity = args.nodes * GPUS_PER_NODE
    print(f"bench: {args.nodes} nodes x {GPUS_PER_NODE} GPUs per scheduler, seed {args.seed}, on a fresh control "
          f"plane in {args.state}", flush=True)
    try:
        started = time.monotonic()
        cluster.control_plane_up(config, build=False, wait_timeout=600)
        print(f"--> bench lab up in {format_seconds(time.monotonic() - started)}; deploying the bin-packing scheduler",
              flush=True)
        core = cluster.kube_client(paths.admin_kubeconfig)
        deploy_binpack(paths.admin_kubeconfig, parse_resources(args.resources), args.strategy)
        wait_lease(core, "gpu-binpack")
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        groups = [Group(core, name, scheduler, args.nodes) for name, scheduler in SCHEDULERS.items()]
        # Enough jobs to pass 100 % demand and refuse an 8-GPU job whatever the mix; the same sequence for both.
        sequence = jobs(args.seed, 2 * capacity, capacity)
        for group in groups:
            print(f"--> {group.name}: fill phase", flush=True)
            fill(group, sequence)
            group.clear()
            print(f"--> {group.name}: throughput burst of {args.burst} pods", flush=True)
            burst(group, args.burst)
            if args.churn:
                print(f"--> {group.name}: steady state, {args.churn} jobs", flush=True)
                churn(group, jobs(args.seed + 1, args.churn + 50, capacity), steady=50)
                group.clear()
        bound = best_fit_bound(sequence, args.nodes)
        rows = [
            ("", *(f"{g.name} ({g.scheduler or 'default-scheduler'})" for g in groups), "ideal best-fit (simulated)"),
            ("1. GPUs allocated when the first 8-GPU job cannot be placed",
             *(percent(g.figures.allocation_at_first_8gpu_failure) for g in groups), percent(bound[0])),
            ("2. GPUs unallocated when the demand reaches 100 %",
             *(percent(g.figures.unallocated_at_full_demand) for g in groups), percent(bound[1])),
            (f"3. nodes with all 8 GPUs free at 75 % demand (of {args.nodes})",
             *(str(g.figures.free_nodes_at_75) for g in groups), str(bound[2])),
            (f"4. scheduling throughput, {args.burst} pods at once (pods/s)",
             *(f"{g.figures.burst_pods_per_s:.1f}" for g in groups), "-"),
            ("steady state: 8-GPU jobs placed", *(g.figures.churn_8gpu_placed for g in groups), "-"),
            ("steady state: mean GPU allocation", *(percent(g.figures.churn_mean_allocation) for g in groups), "-"),
            ("jobs placed / refused in all", *(f"{g.figures.placed} / {g.figures.refused}" for g in groups), "-"),
        ]
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
        print("\n".join("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows),
              flush=True)
    finally:
        cluster.control_plane_down(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
