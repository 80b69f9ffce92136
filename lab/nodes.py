"""The lab's node hosts: systemd containers (podman) named like the inventory's GPU nodes.

Until the lab's control plane exists, these are what the main job provisions: the node roles run on them through the
podman connection, exactly as they would on real hosts over SSH. The inventory (inventories/lab/hosts.yml) is the only
list of names; this module reads it with ansible-inventory.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Mapping, Sequence

from _common import LabError, cache_root, log, run

ROOT = Path(__file__).resolve().parents[1]
INVENTORY = ROOT / "inventories" / "lab" / "hosts.yml"
NETWORK = "gpu-lab"
LABEL = "gpu-lab.role=node"
IMAGE = "localhost/gpu-lab-debian12:latest"
REPORT = ROOT / "reports" / "nodes.json"
VALIDATION = ROOT / "reports" / "validation.json"
NVIDIA_SMI_DOUBLE = ROOT / "lab" / "doubles" / "nvidia-smi"
# The lab's package mirror (`labctl mirror`), served to the node containers on the lab network under this name:
# inventories/lab points the node roles' mirror sources at http://gpu-lab-mirror:8080/.
MIRROR_SERVER = "gpu-lab-mirror"
MIRROR_LABEL = "gpu-lab.role=mirror"
# What a Kubernetes node has before the node roles run: a container runtime (Debian's containerd, as kubeadm uses).
NODE_RUNTIME_PACKAGES = ("containerd",)


def node_names(inventory_json: dict) -> list[str]:
    """GPU node names from `ansible-inventory --list` output."""
    return list(inventory_json.get("gpu_nodes", {}).get("hosts", []))


def inventory_nodes(ansible_inventory: str) -> list[str]:
    result = run([ansible_inventory, "-i", str(INVENTORY), "--list"])
    names = node_names(json.loads(result.stdout))
    if not names:
        raise LabError(f"{INVENTORY} lists no hosts in the gpu_nodes group")
    return names


def container_states() -> dict[str, str]:
    """Lab node containers that exist, by name, with their podman state."""
    result = run(["podman", "ps", "-a", "--filter", f"label={LABEL}", "--format", "json"])
    return {entry["Names"][0]: entry["State"] for entry in json.loads(result.stdout or "[]")}


def ensure_network() -> None:
    if run(["podman", "network", "exists", NETWORK], check=False).returncode != 0:
        run(["podman", "network", "create", NETWORK])
        log(f"created podman network {NETWORK}")


def wait_for_systemd(name: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = run(["podman", "exec", name, "systemctl", "is-system-running"], check=False).stdout.strip()
        if state in ("running", "degraded"):
            return
        time.sleep(1)
    raise LabError(f"{name}: systemd did not finish booting within {timeout:.0f} s (state {state!r})")


def share_debs(directories: list[Path]) -> int:
    """Hard-link every .deb found in any of the directories into all of them; return how many links were made.

    Each node needs its own /var/cache/apt/archives (apt locks it, so nodes installing at the same time cannot share
    one), but what one node or a Molecule run downloaded need not be downloaded again by the others.
    """
    found: dict[str, Path] = {}
    for directory in directories:
        for deb in directory.glob("*.deb"):
            found.setdefault(deb.name, deb)
    linked = 0
    for directory in directories:
        for name, source in found.items():
            target = directory / name
            if not target.exists():
                try:
                    target.hardlink_to(source)
                except OSError:
                    continue  # another filesystem: the node downloads it itself
                linked += 1
    return linked


def install_nvidia_smi_double(name: str, gpus: Mapping[str, object]) -> None:
    """Put the lab's nvidia-smi double and the node's GPU description into a node container.

    /usr/local/bin comes before /usr/bin on PATH, so the double shadows Debian's nvidia-smi (which cannot talk to a
    driver in a container) without touching what the driver role installs.
    """
    run(["podman", "exec", name, "mkdir", "-p", "/etc/gpu-lab", "/usr/local/bin"])
    run(["podman", "cp", str(NVIDIA_SMI_DOUBLE), f"{name}:/usr/local/bin/nvidia-smi"])
    run(["podman", "exec", name, "chmod", "0755", "/usr/local/bin/nvidia-smi"])
    run(["podman", "exec", "-i", name, "sh", "-c", "cat > /etc/gpu-lab/gpus.json"],
        input_text=json.dumps(dict(gpus), indent=2) + "\n")


def ensure_mirror_server() -> None:
    """Serve $GPU_LAB_CACHE/mirror on the lab network, when it has been built."""
    mirror = cache_root() / "mirror"
    if not (mirror / "gpu-lab-mirror.asc").is_file():
        log(f"no package mirror in {mirror}: the node roles' mirror sources will fail until `make mirror` builds it")
        return
    state = run(["podman", "container", "inspect", "--format", "{{.State.Status}}", MIRROR_SERVER],
                check=False).stdout.strip()
    if state == "running":
        return
    if state:
        run(["podman", "rm", "--force", MIRROR_SERVER])
    run(["podman", "run", "-d", "--name", MIRROR_SERVER, "--hostname", MIRROR_SERVER, "--network", NETWORK,
         "--label", MIRROR_LABEL, "--volume", f"{mirror}:/srv/mirror:ro", IMAGE,
         "python3", "-m", "http.server", "8080", "--directory", "/srv/mirror"])
    log(f"package mirror served to the nodes at http://{MIRROR_SERVER}:8080/ from {mirror}")


def install_node_runtime(name: str) -> None:
    """Debian's containerd, installed once per node container (a no-op when it is there)."""
    packages = " ".join(NODE_RUNTIME_PACKAGES)
    script = (f"command -v containerd >/dev/null || {{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
              f"apt-get install -y -qq --no-install-recommends {packages} >/dev/null; }}")
    result = run(["podman", "exec", name, "sh", "-c", script], check=False)
    if result.returncode != 0:
        raise LabError(f"{name}: installing {packages} failed: {(result.stderr or result.stdout).strip()[-500:]}")


def up(names: Sequence[str], gpus: Mapping[str, Mapping[str, object]]) -> list[str]:
    """Start (or keep) one systemd container per host node; `gpus` describes each node's GPUs for the double."""
    names = list(names)
    if not names:
        return names
    ensure_network()
    shared = cache_root() / "apt-archives" / "debian12"
    node_archives = {name: cache_root() / "apt-archives" / "nodes" / name for name in names}
    for directory in [shared, *node_archives.values()]:
        (directory / "partial").mkdir(parents=True, exist_ok=True)
    linked = share_debs([shared, *node_archives.values()])
    log(f"apt archives: {linked} downloaded packages shared between the nodes and the test runs")
    existing = container_states()
    for name in names:
        state = existing.get(name)
        if state == "running":
            log(f"{name}: already running")
            continue
        if state is not None:
            run(["podman", "start", name])
            log(f"{name}: started again")
        else:
            run(["podman", "run", "-d", "--name", name, "--hostname", name, "--network", NETWORK,
                 "--label", LABEL, "--volume", f"{node_archives[name]}:/var/cache/apt/archives", IMAGE])
            log(f"{name}: created from {IMAGE}")
    ensure_mirror_server()
    for name in names:
        wait_for_systemd(name)
        install_node_runtime(name)
        if name in gpus:
            install_nvidia_smi_double(name, gpus[name])
    log(f"lab node containers up, with containerd: {', '.join(names)}")
    return names


def down() -> None:
    names = sorted(container_states())
    if names:
        run(["podman", "rm", "--force", *names])
    run(["podman", "rm", "--force", "--ignore", MIRROR_SERVER])
    if run(["podman", "network", "exists", NETWORK], check=False).returncode == 0:
        run(["podman", "network", "rm", NETWORK])
    log(f"lab nodes removed: {', '.join(names) or 'none were there'}")


def status() -> str:
    states = container_states()
    if not states:
        return "lab nodes: none (run `make lab` or `python3 lab/labctl.py up`)"
    lines = [f"{'node':<14} state"] + [f"{name:<14} {state}" for name, state in sorted(states.items())]
    return "\n".join(lines)


def gpu_check(gpu: dict) -> str:
    """The validation column: healthy with the GPU count, or what failed."""
    if not gpu:
        return "not run"
    if gpu.get("error_kind"):
        error = " ".join(str(gpu.get("error") or "").split())
        error = error if len(error) <= 60 else error[:57] + "..."
        return f"{gpu['error_kind']}: {error}".rstrip(": ")
    return f"healthy, {gpu.get('gpu_count', 0)} GPUs" if gpu.get("healthy") else "; ".join(gpu.get("problems", []))


def cuda_cell(facts: Mapping[str, object]) -> str:
    """CUDA versions installed, the default marked: '12.8*, 13.0' (from the cuda_toolkit role's local facts)."""
    versions = [str(v) for v in facts.get("versions") or []]  # type: ignore[union-attr]
    if not versions:
        return "-"
    default = str(facts.get("default_version", ""))
    return ", ".join(f"{v}*" if v == default else v for v in versions)


def toolkit_cell(facts: Mapping[str, object]) -> str:
    """Toolkit version and the runtimes wired: '1.18.1: containerd, docker (default)'."""
    if not facts.get("version"):
        return "-"
    defaults = set(facts.get("default_for") or [])  # type: ignore[arg-type]
    runtimes = [f"{r} (default)" if r in defaults else str(r) for r in facts.get("runtimes") or []]  # type: ignore
    return f"{facts['version']}: {', '.join(runtimes) or 'no runtime'}"


def summary_table(report: dict, cluster_rows: Sequence[Mapping[str, str]] = ()) -> str:
    """The main job's closing table: each node's cluster view (simulated node, GPUs the device plugin advertises)
    beside its host view (reports/nodes.json from playbooks/report.yml: driver, held packages, GPU check)."""
    header = ("node", "cluster", "GPUs advertised", "driver source/branch", "packages held", "module", "action",
              "CUDA", "container toolkit", "GPU check")
    in_cluster = {row["name"]: row for row in cluster_rows}
    rows = []
    for node in sorted(set(report) | set(in_cluster)):
        entry = report.get(node)
        seen = in_cluster.get(node, {})
        cluster_cells = (seen.get("ready", "not in cluster"), seen.get("gpus", "-"))
        if entry is None:
            rows.append((node, *cluster_cells, "-", "-", "-", "-", "-", "-", "no host (simulated only)"))
            continue
        facts = entry.get("nvidia_driver") or {}
        managed = facts.get("managed") or {}
        selection = f"{managed.get('source', '-')}/{managed.get('branch', '-')} ({managed.get('kernel_modules', '-')})"
        held = str(len(managed.get("packages", []))) if managed.get("held") else "no"
        module = facts.get("loaded_version") or ("not loaded (container)" if facts.get("in_container") else "not loaded")
        action = facts.get("action", "-")
        if action not in ("none", "-"):
            action += f": {facts.get('action_reason', '')}"
        rows.append((node, *cluster_cells, selection, held, module, action, cuda_cell(entry.get("cuda_toolkit") or {}),
                     toolkit_cell(entry.get("nvidia_container_toolkit") or {}), gpu_check(entry.get("nvidia_gpu") or {})))
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    render = lambda row: "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join([render(header), render(tuple("-" * w for w in widths)), *(render(row) for row in rows)])


def merge_reports(nodes_report: Mapping[str, dict], validation: Mapping[str, object]) -> dict:
    """nodes.json (what the node roles did) with each host's GPU check from validation.json."""
    hosts = validation.get("hosts") or {}
    merged = {name: dict(entry) for name, entry in nodes_report.items()}
    for name, facts in hosts.items():  # type: ignore[union-attr]
        merged.setdefault(name, {})["nvidia_gpu"] = facts
    return merged


def verdict_lines(validation: Mapping[str, object]) -> list[str]:
    if not validation:
        return ["validation: not run (reports/validation.json is missing)"]
    smoke = validation.get("smoke") or {}
    smoke_text = ("CUDA smoke Job succeeded on " + str(smoke.get("node")) if smoke.get("succeeded")  # type: ignore
                  else "CUDA smoke Job not run" if not smoke.get("ran") else "CUDA smoke Job failed")  # type: ignore
    if validation.get("passed"):
        return [f"validation: PASSED (hosts, cluster, {smoke_text}; details in reports/validation.txt)"]
    problems = list(validation.get("problems") or [])  # type: ignore[call-overload]
    return [f"validation: FAILED, {len(problems)} problem(s) (reports/validation.txt):"] + [f"  - {p}" for p in problems]


def summary(cluster_rows: Sequence[Mapping[str, str]] = ()) -> str:
    if not REPORT.exists():
        raise LabError(f"{REPORT} is missing: run playbooks/site.yml first")
    report = json.loads(REPORT.read_text(encoding="utf-8"))
    validation = json.loads(VALIDATION.read_text(encoding="utf-8")) if VALIDATION.exists() else {}
    if not report and not cluster_rows:
        raise LabError(f"{REPORT} lists no GPU nodes and the lab cluster is not running")
    return summary_table(merge_reports(report, validation), cluster_rows) + "\n\n" + "\n".join(verdict_lines(validation))
