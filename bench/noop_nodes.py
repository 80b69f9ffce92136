"""Benchmark: a no-op `playbooks/nodes.yml` on the lab's node containers against the cost of a remote round trip.

A measurement, not a test: it prints figures and fails only when a run fails. On the running lab (`make lab` first, or
pass --converge to run nodes.yml once before measuring):

    .venv/bin/python bench/noop_nodes.py [--converge] [--pings 40]

It times, on the same hosts and in the same run:
  1. a no-op nodes.yml (it must report no change), with profile_tasks for its slowest tasks;
  2. a playbook of one `ansible.builtin.ping` task and one of --pings of them, so that the cost of one remote task on
     every host at once is (T(pings) - T(1)) / (pings - 1);
and prints the no-op run's wall time, that time in round-trip equivalents (wall / cost of one remote task), and the
podman calls the run really made per host (every call goes through a counting wrapper of the podman executable:
`exec` is one remote command, `mount`/`cp` are file copies).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))

from _common import format_seconds  # noqa: E402

INVENTORY = ROOT / "inventories" / "lab" / "hosts.yml"
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)
# podman's global options that take a value: the first other word is the subcommand.
PODMAN_VALUE_OPTIONS = {"--root", "--runroot", "--storage-driver", "--cgroup-manager", "--log-level", "--url",
                        "--connection", "--identity", "--events-backend", "--network-cmd-path", "--tmpdir"}

WRAPPER = """#!/bin/sh
# bench/noop_nodes.py: one line per podman call (its arguments), then the real podman.
printf '%s\\n' "$*" >> "{log}"
exec "{podman}" "$@"
"""


def controller_cpu() -> float:
    """CPU seconds of this process's waited-for children: ansible-playbook, its workers, the modules it runs on the
    controller and the podman clients (what runs inside the node containers is not the controller's)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def playbook(args: list[str], env: dict[str, str]) -> tuple[float, str, float]:
    """(wall seconds, output, controller CPU seconds) of one ansible-playbook run."""
    started, cpu = time.monotonic(), controller_cpu()
    result = subprocess.run(["ansible-playbook", "-i", str(INVENTORY), *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    elapsed = time.monotonic() - started
    cpu = controller_cpu() - cpu
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-6000:])
        raise SystemExit(f"ansible-playbook {' '.join(args)} failed (rc={result.returncode})")
    return elapsed, result.stdout, cpu


def podman_calls(log: Path, hosts: list[str]) -> dict[str, collections.Counter]:
    """Per host: podman subcommands that named it (exec, mount, cp, ...)."""
    calls: dict[str, collections.Counter] = {host: collections.Counter() for host in hosts}
    if not log.exists():
        return calls
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        words = line.split()
        subcommand, skip = None, False
        for word in words:
            if skip:
                skip = False
                continue
            if word in PODMAN_VALUE_OPTIONS:
                skip = True
                continue
            if not word.startswith("-"):
                subcommand = word
                break
        host = next((word for word in words if word in calls), None)
        if host is None:
            host = next((h for h in hosts if any(w.startswith(h + ":") for w in words)), None)  # cp host:/path
        if host is not None and subcommand:
            calls[host][subcommand] += 1
    return calls


def ping_playbook(directory: Path, count: int) -> Path:
    path = directory / f"ping-{count}.yml"
    tasks = "".join(f"    - name: Ping {index}\n      ansible.builtin.ping:\n" for index in range(count))
    path.write_text(f"---\n- name: Ping the GPU nodes\n  hosts: gpu_nodes\n  gather_facts: false\n  tasks:\n{tasks}",
                    encoding="utf-8")
    return path


def slowest_tasks(output: str, top: int = 12) -> list[tuple[float, str]]:
    rows = re.findall(r"^(.+?) -+ (\d+\.\d+)s$", output, re.MULTILINE)
    return sorted(((float(seconds), name.strip()) for name, seconds in rows), reverse=True)[:top]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--converge", action="store_true", help="run nodes.yml once first (a fresh lab)")
    parser.add_argument("--pings", type=int, default=40, help="ping tasks of the long ping playbook (default 40)")
    args = parser.parse_args()
    if args.pings < 2:
        parser.error("--pings must be at least 2")
    podman = shutil.which("podman")
    if podman is None:
        raise SystemExit("podman is not installed: run `make lab` first")
    with tempfile.TemporaryDirectory(prefix="bench-noop-nodes-") as scratch:
        directory = Path(scratch)
        log = directory / "podman-calls.log"
        wrapper = directory / "podman"
        wrapper.write_text(WRAPPER.format(log=log, podman=podman), encoding="utf-8")
        wrapper.chmod(0o755)
        env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
               "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}", "ANSIBLE_PODMAN_EXECUTABLE": str(wrapper)}
        if args.converge:
            print("--> converging the node containers (nodes.yml) ...", flush=True)
            elapsed, _, _ = playbook(["playbooks/nodes.yml"], env)
            print(f"<-- converged in {format_seconds(elapsed)}", flush=True)
        print("--> no-op nodes.yml (profile_tasks) ...", flush=True)
        log.unlink(missing_ok=True)
        profiled = {**env, "ANSIBLE_CALLBACKS_ENABLED": "gpu_ops.cluster.preload,ansible.posix.profile_tasks",
                    "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "200"}
        noop, output, _ = playbook(["playbooks/nodes.yml"], profiled)
        recap = {host: (int(ok), int(changed)) for host, ok, changed, _, _ in RECAP.findall(output)}
        hosts = sorted(recap)
        calls = podman_calls(log, hosts)
        changed = {host: c for host, (_, c) in recap.items() if c}
        print(f"<-- {format_seconds(noop)}" + (f"; NOT a no-op, changed: {changed}" if changed else ""), flush=True)
        # Controller CPU without profile_tasks: the project's callbacks (ansible.cfg), then without the preload one.
        print("--> no-op nodes.yml twice more, with and without the preload callback (controller CPU) ...", flush=True)
        _, _, cpu_preload = playbook(["playbooks/nodes.yml"], env)
        without = {**env, "ANSIBLE_CALLBACKS_ENABLED": "gpu_ops.cluster.run_record"}
        _, _, cpu_plain = playbook(["playbooks/nodes.yml"], without)
        print(f"<-- {cpu_preload:.1f} and {cpu_plain:.1f} CPU s", flush=True)
        print(f"--> ping playbooks (1 and {args.pings} tasks) ...", flush=True)
        one, _, _ = playbook([str(ping_playbook(directory, 1))], env)
        many, _, _ = playbook([str(ping_playbook(directory, args.pings))], env)
        per_task = (many - one) / (args.pings - 1)
        print(f"<-- 1 task {format_seconds(one)}, {args.pings} tasks {format_seconds(many)}", flush=True)

    print(f"\nno-op playbooks/nodes.yml on {len(hosts)} node containers ({', '.join(hosts)})")
    print(f"  wall time                       {format_seconds(noop)}")
    print(f"  one remote task on every host   {per_task:.2f} s  (ping playbooks: (T({args.pings}) - T(1)) / {args.pings - 1})")
    print(f"  playbook start-up (1 ping)      {format_seconds(one)}")
    print(f"  round-trip equivalents          {noop / per_task:.0f}  (wall / one remote task)")
    print(f"  controller CPU                  {cpu_preload:.1f} s, {cpu_preload / len(hosts):.2f} s per host"
          f" (without the preload callback {cpu_plain:.1f} s, {cpu_plain / len(hosts):.2f} s per host)")
    print(f"  beyond start-up                 {(noop - one) / per_task:.0f}  ((wall - T(1)) / one remote task)")
    print("  podman calls per host           " + "; ".join(
        f"{host}: {sum(c.values())} ({', '.join(f'{n} {kind}' for kind, n in c.most_common())})"
        for host, c in calls.items()))
    print("  tasks that ran per host (ok)    " + ", ".join(f"{host}: {ok}" for host, (ok, _) in recap.items()))
    print("  slowest tasks (profile_tasks)")
    for seconds, name in slowest_tasks(output):
        print(f"    {seconds:6.2f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
