"""Benchmark: a lab control plane with N simulated GPU nodes (default 1000).

A measurement, not a test: it prints figures and fails only if the lab fails to come up. It runs a separate lab
(state in /var/lib/gpu-lab-bench, every port shifted by --port-offset) so a running lab is left alone, and removes it
afterwards. Usage (as root, after `make lab-build`):
    .venv/bin/python bench/lab_scale.py [--nodes 1000] [--settle 30]
Figures: control-plane start, node registration, time to all nodes Ready with GPUs advertised, the device-plugin
double's first full pass, and peak resident memory (VmHWM) of kube-apiserver and etcd.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))

import cluster  # noqa: E402
import config as lab_config  # noqa: E402
from _common import format_bytes, format_seconds  # noqa: E402

# Shares of the node count: mostly 8-GPU H100 nodes, some 4-GPU A100 nodes, a few CPU-only nodes.
SHARES = (("bench-h100", 0.6, "NVIDIA H100 80GB HBM3", 8, 81559), ("bench-a100", 0.3, "NVIDIA A100-SXM4-40GB", 4, 40960),
          ("bench-cpu", 0.1, None, 0, 0))


def bench_config(nodes: int, port_offset: int) -> lab_config.LabConfig:
    base = lab_config.load()
    pools = []
    remaining = nodes
    for index, (prefix, share, product, count, memory) in enumerate(SHARES):
        size = remaining if index == len(SHARES) - 1 else int(nodes * share)
        remaining -= size
        gpu = lab_config.GpuSpec(product, count, memory, True) if product else None
        pools.append(lab_config.NodePool(prefix=prefix, count=size, host=False, cpu="96", memory="1Ti", gpu=gpu))
    ports = {name: port + port_offset for name, port in base.ports.items()}
    return lab_config.LabConfig(ports=ports, service_cidr=base.service_cidr, cluster_name="gpu-lab-bench",
                                device_plugin_double=base.device_plugin_double, pools=tuple(pools))


def time_cluster_check(kubeconfig: Path) -> tuple[float, int]:
    """The cluster check module over the whole cluster, run the way a playbook runs it (ad hoc, JSON callback)."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
           "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    started = time.monotonic()
    result = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible"), "localhost", "-m", "gpu_ops.cluster.gpu_cluster_check",
                             "-a", json.dumps({"kubeconfig": str(kubeconfig)})],
                            cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"gpu_cluster_check failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    host = json.loads(result.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return elapsed, host["ansible_facts"]["gpu_cluster"]["gpu_node_count"], host.get("timings") or {}


def describe_timings(wall: float, timings: dict) -> str:
    """Where the check's wall time went: Ansible on the controller (wall - the module process's life), then the
    module's own parts (gpu_cluster_check's `timings`)."""
    parts = [("ansible (controller start, inventory, module transfer)", wall - timings.get("total", 0.0))]
    parts += [(name, seconds) for name, seconds in timings.items() if name != "total"]
    return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in sorted(parts, key=lambda part: -part[1]))


def peak_rss(pid: int | None) -> int:
    """VmHWM: the process's peak resident set size, in bytes."""
    if pid is None:
        return 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--port-offset", type=int, default=1000)
    parser.add_argument("--settle", type=float, default=30.0, help="seconds of heartbeats before reading memory")
    parser.add_argument("--state", default="/var/lib/gpu-lab-bench")
    args = parser.parse_args()
    os.environ[cluster.STATE_ENV] = args.state
    config = bench_config(args.nodes, args.port_offset)
    paths = cluster.Paths(cluster.state_root())
    cluster.control_plane_down(config)
    gpus = sum(pool.count * (pool.gpu.count if pool.gpu else 0) for pool in config.pools)
    print(f"bench: {args.nodes} simulated nodes ({gpus} GPUs) on a fresh control plane in {args.state}", flush=True)
    try:
        start = time.monotonic()
        empty = config.with_pools(())
        cluster.control_plane_up(empty, build=False)
        plane_s = time.monotonic() - start
        core = cluster.kube_client(paths.admin_kubeconfig)
        start = time.monotonic()
        created, _ = cluster.ensure_nodes(core, config)
        register_s = time.monotonic() - start
        ready_s = register_s + cluster.wait_nodes(core, config, timeout=1800)
        check_s, check_nodes, check_timings = time_cluster_check(paths.admin_kubeconfig)
        time.sleep(args.settle)
        apiserver = cluster.read_pid(paths, "kube-apiserver")
        etcd = cluster.read_pid(paths, "etcd")
        rows = [
            ("control plane start (etcd, apiserver, controller-manager, scheduler, kwok, double)", format_seconds(plane_s)),
            (f"register {created} nodes (parallel POSTs)", format_seconds(register_s)),
            ("first POST to all nodes Ready with GPUs advertised", format_seconds(ready_s)),
            (f"gpu_cluster_check through Ansible ({check_nodes} GPU nodes; one LIST per kind)", format_seconds(check_s)),
            ("  where its time went", describe_timings(check_s, check_timings)),
            (f"kube-apiserver peak RSS (after {args.settle:.0f} s of heartbeats)", format_bytes(peak_rss(apiserver))),
            ("etcd peak RSS", format_bytes(peak_rss(etcd))),
            ("etcd data on disk", format_bytes(sum(p.stat().st_size for p in paths.etcd_data.rglob("*") if p.is_file()))),
        ]
        width = max(len(name) for name, _ in rows)
        print("\n".join(f"  {name.ljust(width)}  {value}" for name, value in rows), flush=True)
    finally:
        cluster.control_plane_down(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
