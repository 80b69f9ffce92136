"""Benchmark: the rolling driver upgrade's time per node on the lab, against the bare driver role's run.

A measurement, not a test: it prints figures and fails only when a run fails. On the running lab (`make lab` first):

    .venv/bin/python bench/driver_upgrade.py [--node gpu-h100-1] [--branches 590 595]

On one GPU node (the others carry the rollout's skip label, so the rollout takes only it), alternately to each
branch of --branches (the lab mirror's driver doubles, NVIDIA's naming from 590):
  1. the bare role: `nodes.yml --tags nvidia_driver --limit NODE -e nvidia_driver_branch=B`;
  2. the rollout: `upgrade.yml -e gpu_driver_upgrade_branch=B` (read, plan, cordon, wait, evict, the same driver
     role, validate on the host and in the cluster, uncordon, report);
and prints both wall times and the orchestration's overhead (rollout - bare role), the median of --rounds rounds.
The node is left at the last branch, with the lab mirror as its driver source: `make lab` again puts the main job's
driver back.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))

import cluster  # noqa: E402

INVENTORY = ROOT / "inventories" / "lab" / "hosts.yml"
GPU_NODES = ("gpu-a100-0", "gpu-h100-0", "gpu-h100-1")
SKIP_LABEL = "gpu-cluster.dev/driver-upgrade.skip"
MIRROR = "http://gpu-lab-mirror:8080"
DRIVER_FROM_MIRROR = {"nvidia_driver_source": "mirror", "nvidia_driver_mirror_packages": "cuda_repo",
                      "nvidia_driver_mirror_url": f"{MIRROR}/cuda/repos/debian12/x86_64/",
                      "nvidia_driver_mirror_key_url": f"{MIRROR}/gpu-lab-mirror.asc", "nvidia_driver_kernel_modules": "open"}


def env() -> dict[str, str]:
    return {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
            "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}


def role_run(node: str, common: dict, branch: str) -> list[str]:
    return ["ansible-playbook", "-i", str(INVENTORY), "playbooks/nodes.yml", "--tags", "nvidia_driver", "--limit", node,
            "-e", json.dumps({**common, "nvidia_driver_branch": branch})]


def timed(argv: list[str]) -> float:
    started = time.monotonic()
    run = subprocess.run(argv, cwd=ROOT, env=env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         check=False)
    took = time.monotonic() - started
    if run.returncode != 0:
        sys.exit(f"failed ({run.returncode}): {' '.join(argv)}\n{run.stdout[-4000:]}")
    return took


def label_nodes(kubeconfig: Path, names: list[str], value: str | None) -> None:
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
    for name in names:
        api.patch_node(name, {"metadata": {"labels": {SKIP_LABEL: value}}})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--node", default="gpu-h100-1", choices=GPU_NODES)
    parser.add_argument("--branches", nargs=2, default=["590", "595"])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    kubeconfig = cluster.Paths(cluster.state_root()).admin_kubeconfig
    others = [name for name in GPU_NODES if name != args.node]
    common = {**DRIVER_FROM_MIRROR, "gpu_cluster_kubeconfig": str(kubeconfig)}
    first, second = args.branches
    bare, rollout = [], []
    label_nodes(kubeconfig, others, "true")
    try:
        # The node starts at the second branch; each round the bare role moves it to the first, the rollout back.
        timed(role_run(args.node, common, second))
        for _ in range(args.rounds):
            bare.append(timed(role_run(args.node, common, first)))
            rollout.append(timed(["ansible-playbook", "-i", str(INVENTORY), "playbooks/upgrade.yml",
                                  "-e", json.dumps({**common, "gpu_driver_upgrade_branch": second,
                                                    "gpu_driver_upgrade_report_dir": "/tmp/bench-driver-upgrade"})]))
    finally:
        label_nodes(kubeconfig, others, None)
    median_bare, median_rollout = statistics.median(bare), statistics.median(rollout)
    print(f"node {args.node}, {second} -> {first} by the bare role, {first} -> {second} by the rollout, "
          f"{len(bare)} round(s)")
    print(f"  bare driver role (nodes.yml --tags nvidia_driver): median {median_bare:.1f} s  {[round(t, 1) for t in bare]}")
    print(f"  rollout (upgrade.yml, one node):                   median {median_rollout:.1f} s  "
          f"{[round(t, 1) for t in rollout]}")
    print(f"  orchestration overhead: {median_rollout - median_bare:.1f} s per node "
          f"({median_rollout / median_bare:.2f}x the bare role)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
