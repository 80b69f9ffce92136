#!/usr/bin/env python3
"""Wall times of playbooks/tenancy.yml on a running lab: first apply, no-op re-apply and check run for N teams.

It measures, it never fails on a slow machine. Uses the lab found through GPU_LAB_STATE (default /var/lib/gpu-lab);
its teams are named bench-<n>-<suffix> and deleted (state: absent) at the end.

    .venv/bin/python bench/tenancy_apply.py --teams 10 20
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def run(kubeconfig: Path, teams: list[dict], *args: str) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as extra:
        yaml.safe_dump({"tenancy_teams": teams}, extra)
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    start = time.monotonic()
    result = subprocess.run(["ansible-playbook", "-i", "inventories/lab/hosts.yml", "playbooks/tenancy.yml",
                             "-e", f"gpu_cluster_kubeconfig={kubeconfig}", "-e", f"@{extra.name}", *args],
                            cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - start
    os.unlink(extra.name)
    if result.returncode != 0:
        sys.exit(result.stdout[-3000:] + result.stderr[-2000:])
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teams", type=int, nargs="+", default=[10])
    args = parser.parse_args()
    kubeconfig = Path(os.environ.get("GPU_LAB_STATE", "/var/lib/gpu-lab")) / "pki" / "admin.kubeconfig"
    print(f"{'teams':>6} {'apply s':>8} {'re-apply s':>11} {'check s':>8} {'delete s':>9}")
    for count in args.teams:
        suffix = uuid.uuid4().hex[:6]
        teams = [{"name": f"bench-{n}-{suffix}", "members": {"users": [f"user-{n}"]}, "gpus": {"nvidia.com/gpu": 4}}
                 for n in range(count)]
        first = run(kubeconfig, teams)
        again = run(kubeconfig, teams)
        check = run(kubeconfig, teams, "--check")
        gone = run(kubeconfig, [{**team, "state": "absent"} for team in teams])
        print(f"{count:>6} {first:>8.1f} {again:>11.1f} {check:>8.1f} {gone:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
