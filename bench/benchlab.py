"""What the bench scripts that start their own bench lab share: taking the lab's state directory, and running
playbooks/cluster.yml's roles against that lab from an inventory with no reachable GPU host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))

import cluster  # noqa: E402


def take_state(state: str, config) -> "cluster.Paths":  # noqa: ANN001
    """As root only; the bench lab's state in `state`, whatever ran there before stopped."""
    if os.geteuid() != 0:
        raise SystemExit("run as root (the bench lab keeps its state under /var/lib)")
    os.environ[cluster.STATE_ENV] = state
    paths = cluster.Paths(cluster.state_root())
    cluster.control_plane_down(config)
    return paths


def run_cluster_roles(kubeconfig: Path, tags: str, what: str, *, gpu_nodes: dict | None = None,
                      extra_vars: dict | None = None) -> float:
    """playbooks/cluster.yml limited to cluster_control (localhost) and `tags`; gpu_nodes is the inventory's GPU node
    group ({"hosts": ..., "vars": ...}; the cluster roles read its hostvars, no play connects to it). Returns the
    seconds it took; fails the bench with the play's output when the play fails."""
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        inventory = Path(tmp) / "hosts.yml"
        inventory.write_text(yaml.safe_dump({"all": {"children": {
            "gpu_nodes": gpu_nodes or {"hosts": {}},
            "cluster_control": {"hosts": {"localhost": {
                "ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}},
                "vars": {"gpu_cluster_kubeconfig": str(kubeconfig)}}}}}))
        command = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "playbooks/cluster.yml", "-i", str(inventory),
                   "--limit", "cluster_control", "--tags", tags]
        if extra_vars:
            command += ["-e", json.dumps(extra_vars)]
        started = time.monotonic()
        result = subprocess.run(command, cwd=ROOT, env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise SystemExit(f"{what} failed:\n{result.stdout[-4000:]}")
        return time.monotonic() - started
