"""Benchmark: applying the whole cluster stack (playbooks/cluster.yml: GPU node labels and RuntimeClass, device
plugin, DCGM exporter, Prometheus, Grafana) to a fresh lab cluster, then the no-op re-applies.

A measurement, not a test: it prints figures and fails only if a run fails. It starts a separate control plane
(state in /var/lib/gpu-lab-bench-stack, every port shifted by --port-offset) with lab/lab.yml's nodes, so a running
lab is left alone, and removes it afterwards. Usage (as root, after `make lab-build`):
    .venv/bin/python bench/cluster_stack.py [--repeat 3]
Figures: wall time and changed tasks of the first apply, of each no-op re-apply and of a check-mode run, and the
median no-op; ansible.posix.profile_roles gives the time per role of the first apply.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))

import cluster  # noqa: E402
import config as lab_config  # noqa: E402
from _common import format_seconds  # noqa: E402


def run_stack(kubeconfig: Path, *extra: str) -> tuple[float, int, str]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_CALLBACKS_ENABLED": "gpu_ops.cluster.preload,ansible.posix.profile_roles",
           "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    started = time.monotonic()
    result = subprocess.run(["ansible-playbook", "playbooks/cluster.yml", "-i", "inventories/lab/hosts.yml",
                             "-e", f"gpu_cluster_kubeconfig={kubeconfig}", *extra],
                            cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"cluster.yml failed:\n{result.stdout[-4000:]}{result.stderr[-2000:]}")
    changed = re.search(r"^localhost\s+: ok=\d+\s+changed=(\d+)", result.stdout, re.MULTILINE)
    return elapsed, int(changed.group(1)) if changed else -1, result.stdout


def role_times(output: str) -> list[str]:
    """The profile_roles summary lines ('role_name ---- 12.34s')."""
    return [line.strip() for line in output.splitlines() if re.match(r"^\S+ -+ \d+\.\d+s$", line.strip())]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="no-op re-applies (default 3)")
    parser.add_argument("--port-offset", type=int, default=3000)
    parser.add_argument("--state", default="/var/lib/gpu-lab-bench-stack")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (the lab keeps its state under /var/lib)")
    os.environ[cluster.STATE_ENV] = args.state
    base = lab_config.load()
    config = dataclasses.replace(base, ports={name: port + args.port_offset for name, port in base.ports.items()},
                                 cluster_name="gpu-lab-bench-stack")
    kubeconfig = cluster.Paths(cluster.state_root()).admin_kubeconfig
    cluster.control_plane_down(config)
    try:
        cluster.control_plane_up(config, build=False)
        first, first_changed, output = run_stack(kubeconfig)
        print(f"first apply (fresh cluster): {format_seconds(first)}, {first_changed} tasks changed", flush=True)
        for line in role_times(output):
            print(f"  {line}")
        noops = []
        for index in range(args.repeat):
            elapsed, changed, _ = run_stack(kubeconfig)
            noops.append(elapsed)
            print(f"no-op re-apply {index + 1}: {format_seconds(elapsed)}, {changed} tasks changed", flush=True)
        check, check_changed, _ = run_stack(kubeconfig, "--check")
        print(f"check mode after converge: {format_seconds(check)}, {check_changed} tasks changed")
        print(f"median no-op re-apply: {format_seconds(statistics.median(noops))} "
              f"({statistics.median(noops) / first:.2f} of the first apply)")
    finally:
        cluster.control_plane_down(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
