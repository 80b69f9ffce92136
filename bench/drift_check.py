"""Benchmark: what a drift check (runner/gpu_ops_drift.py) costs next to a no-op site.yml, and at scale.

A measurement, not a test: it prints figures and fails only if a run fails. Against the running lab (inventories/lab,
converged by `make lab`) it times, alternately, N rounds of a no-op `ansible-playbook playbooks/site.yml` and of
`runner/gpu_ops_drift.py check --detect-only` (reports in a temporary directory, removed afterwards), and prints the
medians, the ratio drift/site and the peak memory of both. --cluster-only limits both to cluster_control.
With --noop-cluster it times a no-op `playbooks/cluster.yml` (cluster_control) on the running lab, counts its API requests
in the lab's audit log, and times the floor: a playbook making the same number of `kubernetes.core.k8s_info` calls (one
task looping over them, each a GET of the kube-system namespace), so the no-op run reads as a multiple of the cheapest
way Ansible can make that many requests. --scale-nodes does the same accounting on its bench lab.
With --scale-nodes N it leaves the running lab alone and starts a separate bench lab with N simulated nodes
(bench/lab_scale.py's configuration: 90% of them GPU nodes; state in /var/lib/gpu-lab-bench-drift, every port shifted
by --port-offset), converges it with playbooks/cluster.yml, times a cluster-only drift check there, and removes it.
Usage (as root, after `make lab`, or `make lab-build` for --scale-nodes):
    .venv/bin/python bench/drift_check.py [--rounds 2] [--cluster-only]
    .venv/bin/python bench/drift_check.py --noop-cluster
    .venv/bin/python bench/drift_check.py --scale-nodes 1000
Peak memory, two measures: ru_maxrss from wait4() on the measured process (what /usr/bin/time -v prints as "Maximum
resident set size"): the largest single process of its tree, itself or a descendant it waited for, not a sum; and the
process's own VmHWM, sampled while it runs. For the runner the first is ansible-playbook's or one of its forks', which
dominate; the second is the runner's own Python.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "lab"))

import cluster  # noqa: E402
import config as lab_config  # noqa: E402
import lab_scale  # noqa: E402  (its bench lab configuration, the same node mix as make bench-scale, and peak_rss)
from _common import format_bytes, format_seconds  # noqa: E402

VENV_BIN = ROOT / ".venv" / "bin"
LAB_INVENTORY = ROOT / "inventories" / "lab"
RUNNER = ROOT / "runner" / "gpu_ops_drift.py"
# The runner's exit codes that are a completed check: 0 in sync, 2 drift found (or a host unreachable).
CHECK_DONE = (0, 2)


@dataclasses.dataclass(frozen=True)
class Measured:
    seconds: float
    rc: int
    tree_peak_rss: int  # bytes: wait4's ru_maxrss, the largest process of the tree
    own_peak_rss: int  # bytes: the process's own VmHWM, last sampled before it exited
    output: str


def environment() -> dict[str, str]:
    return {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_CALLBACKS_ENABLED": "gpu_ops.cluster.run_record,gpu_ops.cluster.preload,ansible.posix.profile_tasks", "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "100",
            "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}


def run_measured(argv: list[str], what: str, ok: tuple[int, ...] = (0,)) -> Measured:
    """Run to completion; wall time, exit code, the peak RSS of its process tree (wait4's ru_maxrss) and its own."""
    own_peak = 0
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as log:
        started = time.monotonic()
        process = subprocess.Popen(argv, cwd=ROOT, env=environment(), stdout=log, stderr=subprocess.STDOUT)
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            # Until wait4 reaps it the process's /proc entry stays (a zombie's has no VmHWM: 0).
            own_peak = max(own_peak, lab_scale.peak_rss(process.pid))
            time.sleep(0.1)
        elapsed = time.monotonic() - started
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4: Popen must not wait for it again
        log.seek(0)
        output = log.read()
    if process.returncode not in ok:
        raise SystemExit(f"{what} failed (rc {process.returncode}): {' '.join(argv)}\n{output[-4000:]}")
    return Measured(elapsed, process.returncode, usage.ru_maxrss * 1024, own_peak, output)


def changed_tasks(output: str) -> int:
    """Changed tasks over every host of the PLAY RECAP (a no-op run says 0)."""
    return sum(int(n) for n in re.findall(r"^\S+\s+: ok=\d+\s+changed=(\d+)", output, re.MULTILINE))


def site_run(inventory: Path, limit: str | None) -> Measured:
    argv = [str(VENV_BIN / "ansible-playbook"), "playbooks/site.yml", "-i", str(inventory)]
    return run_measured(argv + (["--limit", limit] if limit else []), "site.yml")


def drift_check(inventory: Path, reports: Path, limit: str | None) -> tuple[Measured, dict]:
    """One detect-only check; its measurement and its report (latest.json)."""
    argv = [str(VENV_BIN / "python"), str(RUNNER), "check", "-i", str(inventory), "--detect-only",
            "--reports", str(reports)]
    measured = run_measured(argv + (["--limit", limit] if limit else []), "the drift check", CHECK_DONE)
    return measured, json.loads((reports / "latest.json").read_text(encoding="utf-8"))


def describe(report: dict) -> str:
    return (f"{report['result']}, {report['counts']['items']} drifted item(s), {len(report['unverifiable'])} "
            f"unverifiable task(s), {len(report['hosts'])} host(s)")


def memory_rows(checks: list[Measured]) -> list[tuple[str, str]]:
    return [("drift runner peak RSS, largest process of its tree (wait4 ru_maxrss; ansible-playbook or a fork)",
             format_bytes(max(m.tree_peak_rss for m in checks))),
            ("drift runner's own Python process peak RSS (VmHWM, sampled)",
             format_bytes(max(m.own_peak_rss for m in checks)))]


def print_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in rows)
    print("\n".join(f"  {name.ljust(width)}  {value}" for name, value in rows), flush=True)


def compare_with_site(rounds: int, cluster_only: bool) -> None:
    limit = "cluster_control" if cluster_only else None
    scope = "cluster_control" if cluster_only else "every host"
    print(f"bench: {rounds} round(s) on the running lab ({LAB_INVENTORY.relative_to(ROOT)}, {scope}): a no-op "
          f"site.yml, then a detect-only drift check", flush=True)
    sites: list[Measured] = []
    checks: list[Measured] = []
    with tempfile.TemporaryDirectory(prefix="gpu-drift-bench-") as tmp:
        for index in range(rounds):
            site = site_run(LAB_INVENTORY, limit)
            sites.append(site)
            print(f"round {index + 1}: site.yml {format_seconds(site.seconds)} ({changed_tasks(site.output)} tasks "
                  f"changed)", flush=True)
            check, report = drift_check(LAB_INVENTORY, Path(tmp) / "reports", limit)
            checks.append(check)
            print(f"round {index + 1}: drift check {format_seconds(check.seconds)} ({describe(report)})", flush=True)
    site_s = statistics.median(m.seconds for m in sites)
    drift_s = statistics.median(m.seconds for m in checks)
    print_rows([
        ("median no-op site.yml", format_seconds(site_s)),
        ("median drift check (check --diff of drift.yml, report, metrics)", format_seconds(drift_s)),
        ("ratio drift check / site.yml", f"{drift_s / site_s:.2f}"),
        *memory_rows(checks),
        ("site.yml peak RSS (ansible-playbook's tree, wait4 ru_maxrss)",
         format_bytes(max(m.tree_peak_rss for m in sites))),
    ])


def audit_offset(paths: cluster.Paths) -> int:
    """Where the lab's audit log (the admin identity's requests, lab/cluster.py) ends now."""
    return paths.audit_log.stat().st_size if paths.audit_log.exists() else 0


def requests_since(paths: cluster.Paths, offset: int) -> collections.Counter:
    """The admin's requests logged after `offset`, by verb and resource (subresource after a slash)."""
    counts: collections.Counter = collections.Counter()
    with paths.audit_log.open("rb") as log:
        log.seek(offset)
        for line in log:
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            resource = "/".join(filter(None, (ref.get("resource"), ref.get("subresource")))) or event["requestURI"]
            counts[(event.get("verb", ""), resource)] += 1
    return counts


def slowest_tasks(output: str, top: int = 5) -> list[tuple[str, str]]:
    """The slowest tasks of a run, from the profile_tasks callback's summary (enabled for the bench's runs)."""
    rows = re.findall(r"^(.+?) -+ (\d+\.\d+)s$", output, re.MULTILINE)
    ranked = sorted(((float(seconds), name.strip()) for name, seconds in rows), reverse=True)[:top]
    return [(f"    {name}", format_seconds(seconds)) for seconds, name in ranked]


def describe_requests(counts: collections.Counter, top: int = 6) -> str:
    """The total, then the largest kinds."""
    kinds = ", ".join(f"{n} {verb} {resource}" for (verb, resource), n in counts.most_common(top))
    return f"{sum(counts.values())} ({kinds})"


FLOOR_PLAY = """- name: The floor of a no-op cluster.yml, {calls} kubernetes.core.k8s_info calls (bench/drift_check.py)
  hosts: cluster_control
  gather_facts: false
  tasks:
    - name: Read the kube-system namespace
      kubernetes.core.k8s_info:
        kubeconfig: "{{{{ gpu_cluster_kubeconfig }}}}"
        kind: Namespace
        name: kube-system
      loop: "{{{{ range({calls}) | list }}}}"
      loop_control:
        label: "{{{{ item }}}}"
"""


def noop_cluster_rows(inventory: Path, paths: cluster.Paths, noop: Measured, requests: collections.Counter,
                      tmp: Path) -> list[tuple[str, str]]:
    """The no-op cluster.yml's requests and its time against the floor: as many k8s_info calls as it made requests."""
    calls = sum(requests.values())
    play = tmp / "k8s_info_floor.yml"
    play.write_text(FLOOR_PLAY.format(calls=calls), encoding="utf-8")
    before = audit_offset(paths)
    floor = run_measured([str(VENV_BIN / "ansible-playbook"), str(play), "-i", str(inventory),
                          "--limit", "cluster_control"], "the k8s_info floor")
    floor_requests = sum(requests_since(paths, before).values())
    return [
        (f"cluster.yml, no-op ({changed_tasks(noop.output)} tasks changed)", format_seconds(noop.seconds)),
        ("  its API requests (audit log)", describe_requests(requests)),
        ("  its slowest tasks (profile_tasks)", ""), *slowest_tasks(noop.output),
        (f"floor: {calls} kubernetes.core.k8s_info calls in one task ({floor_requests} requests logged)",
         format_seconds(floor.seconds)),
        ("  one k8s_info call", format_seconds(floor.seconds / max(calls, 1))),
        ("no-op cluster.yml / floor", f"{noop.seconds / floor.seconds:.2f}"),
    ]


def noop_cluster(inventory: Path) -> None:
    """On the running lab: a no-op cluster.yml, its requests and the k8s_info floor."""
    paths = cluster.Paths(cluster.state_root())
    playbook = [str(VENV_BIN / "ansible-playbook"), "playbooks/cluster.yml", "-i", str(inventory),
                "--limit", "cluster_control"]
    print("bench: a no-op cluster.yml on the running lab, its API requests and the floor of as many k8s_info calls",
          flush=True)
    run_measured(playbook, "cluster.yml (to converge first)")
    before = audit_offset(paths)
    noop = run_measured(playbook, "cluster.yml (no-op)")
    requests = requests_since(paths, before)
    with tempfile.TemporaryDirectory(prefix="gpu-drift-bench-") as tmp:
        print_rows(noop_cluster_rows(inventory, paths, noop, requests, Path(tmp)))


def write_bench_inventory(directory: Path, config: lab_config.LabConfig, kubeconfig: Path) -> Path:
    """An inventory like inventories/lab (its group_vars) for the bench lab: the simulated GPU nodes in gpu_nodes
    (never contacted: every run is limited to cluster_control; they get their labels and expected GPU counts), and
    this machine in cluster_control with the bench lab's kubeconfig."""
    shutil.copytree(LAB_INVENTORY / "group_vars", directory / "group_vars")
    nodes = {name: {"gpu_validation_expected_gpu_count": pool.gpu.count,
                    "gpu_scheduling_node_pool": pool.prefix.removeprefix("bench-")}
             for name, pool in config.nodes() if pool.gpu is not None}
    hosts = directory / "hosts.yml"
    hosts.write_text(yaml.safe_dump({"all": {"children": {
        "gpu_nodes": {"hosts": nodes},
        "cluster_control": {
            "hosts": {"localhost": {"ansible_connection": "local",
                                    "ansible_python_interpreter": "{{ ansible_playbook_python }}"}},
            "vars": {"gpu_cluster_kubeconfig": str(kubeconfig)}},
    }}}, sort_keys=False), encoding="utf-8")
    return hosts


def at_scale(nodes: int, port_offset: int, state: str) -> None:
    if os.geteuid() != 0:
        raise SystemExit("run as root (the bench lab keeps its state under /var/lib)")
    os.environ[cluster.STATE_ENV] = state
    config = lab_scale.bench_config(nodes, port_offset)
    paths = cluster.Paths(cluster.state_root())
    gpu_nodes = len(config.gpu_nodes())
    cluster.control_plane_down(config)
    print(f"bench: {nodes} simulated nodes ({gpu_nodes} with GPUs) on a fresh control plane in {state}", flush=True)
    try:
        started = time.monotonic()
        cluster.control_plane_up(config, build=False, wait_timeout=1800)
        up_s = time.monotonic() - started
        with tempfile.TemporaryDirectory(prefix="gpu-drift-bench-") as tmp:
            kubeconfig = paths.admin_kubeconfig
            inventory = write_bench_inventory(Path(tmp), config, kubeconfig)
            playbook = [str(VENV_BIN / "ansible-playbook"), "playbooks/cluster.yml", "-i", str(inventory),
                        "--limit", "cluster_control"]
            offsets = [audit_offset(paths)]
            apply = run_measured(playbook, "cluster.yml")
            offsets.append(audit_offset(paths))
            noop = run_measured(playbook, "cluster.yml (no-op)")
            offsets.append(audit_offset(paths))
            check, report = drift_check(inventory, Path(tmp) / "reports", "cluster_control")
            counts = [requests_since(paths, offset) for offset in offsets]
            counts = [counts[0] - counts[1], counts[1] - counts[2], counts[2]]
            noop_rows = noop_cluster_rows(inventory, paths, noop, counts[1], Path(tmp))
        print_rows([
            ("bench lab up (control plane, nodes Ready with GPUs advertised)", format_seconds(up_s)),
            (f"cluster.yml, first apply ({changed_tasks(apply.output)} tasks changed)", format_seconds(apply.seconds)),
            ("  its API requests (audit log)", describe_requests(counts[0])),
            ("  its slowest tasks (profile_tasks)", ""), *slowest_tasks(apply.output),
            *noop_rows,
            (f"cluster-only drift check ({describe(report)})", format_seconds(check.seconds)),
            ("  its API requests (audit log)", describe_requests(counts[2])),
            *memory_rows([check]),
        ])
    finally:
        cluster.control_plane_down(config)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2,
                        help="alternating site.yml / drift check rounds on the running lab (default 2)")
    parser.add_argument("--cluster-only", action="store_true", help="limit both runs to cluster_control")
    parser.add_argument("--noop-cluster", action="store_true",
                        help="instead: a no-op cluster.yml on the running lab against as many k8s_info calls")
    parser.add_argument("--scale-nodes", type=int, metavar="N",
                        help="instead: a bench lab with N simulated nodes and one cluster-only drift check there")
    parser.add_argument("--port-offset", type=int, default=2000, help="the bench lab's port shift (--scale-nodes)")
    parser.add_argument("--state", default="/var/lib/gpu-lab-bench-drift", help="the bench lab's state (--scale-nodes)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds}; allowed: 1 or more")
    if args.scale_nodes is not None:
        if args.scale_nodes < 1:
            parser.error(f"--scale-nodes={args.scale_nodes}; allowed: 1 or more")
        at_scale(args.scale_nodes, args.port_offset, args.state)
    elif args.noop_cluster:
        noop_cluster(LAB_INVENTORY)
    else:
        compare_with_site(args.rounds, args.cluster_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
