"""The lab's node hosts: systemd containers (podman) named like the inventory's GPU nodes.

Until the lab's control plane exists, these are what the main job provisions: the node roles run on them through the
podman connection, exactly as they would on real hosts over SSH. The inventory (inventories/lab/hosts.yml) is the only
list of names; this module reads it with ansible-inventory.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

from _common import LabError, cache_root, log, run

ROOT = Path(__file__).resolve().parents[1]
INVENTORY = ROOT / "inventories" / "lab" / "hosts.yml"
NETWORK = "gpu-lab"
LABEL = "gpu-lab.role=node"
IMAGE = "localhost/gpu-lab-debian12:latest"
REPORT = ROOT / "reports" / "nodes.json"
VALIDATION = ROOT / "reports" / "validation.json"
# What `make lab` keeps of its site.yml run (plugins/callback/run_record.py), even when the run fails part way.
RUN_RECORD = ROOT / "reports" / "site-run.json"
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


def container_states(label: str = LABEL) -> dict[str, str]:
    """Lab containers with the label (the node containers by default) that exist, by name, with their podman state."""
    result = run(["podman", "ps", "-a", "--filter", f"label={label}", "--format", "json"])
    return {entry["Names"][0]: entry["State"] for entry in json.loads(result.stdout or "[]")}


def remove_dead_containers(labels: Sequence[str] = (LABEL, MIRROR_LABEL)) -> list[str]:
    """Remove the lab's node and mirror containers that podman lists as running but whose processes are gone; return
    their names.

    podman keeps listing a container as running after its processes were killed with the session that started it
    (its state left behind, no reboot to refresh it). Nothing can run in such a container (`podman exec` answers
    "cannot exec in a stopped container") and `podman start` does not bring it back; the device-plugin double would
    read no GPU from it and the node would never advertise any. Removed, it is created again by `nodes.up`.
    """
    dead = [name for label in labels for name, state in container_states(label).items()
            if state == "running" and not answers(name)]
    if dead:
        remove_containers(dead)
        log(f"listed as running but their processes were gone: {', '.join(dead)}: removed, to be created again")
    return dead


def remove_containers(names: Sequence[str]) -> None:
    """`podman rm --force` the containers (no stop timeout: they are deleted anyway), missing ones ignored.

    A container whose processes were killed behind podman's back fails the first removal ("container state improper:
    stopped"), which marks it exited; the second removes it.
    """
    argv = ["podman", "rm", "--force", "--time", "0", "--ignore", *names]
    if run(argv, check=False).returncode != 0:
        run(argv)


def network_dns(inspect_json: str) -> bool | None:
    """dns_enabled of `podman network inspect` output (None: no such network)."""
    entries = json.loads(inspect_json or "[]")
    return bool(entries[0].get("dns_enabled")) if entries else None


def ensure_network() -> None:
    """The lab's network, with DNS: the nodes reach the mirror by name. A network without DNS (made by an older podman
    setup) is the lab's own, so it is made again, with the lab's containers on it."""
    result = run(["podman", "network", "inspect", NETWORK], check=False)
    dns = network_dns(result.stdout) if result.returncode == 0 else None
    if dns is False:
        attached = sorted(container_states()) + [MIRROR_SERVER]
        log(f"podman network {NETWORK} has no DNS (dns_enabled false): making it again, and the lab's containers on "
            f"it ({', '.join(attached)})")
        remove_containers(attached)
        run(["podman", "network", "rm", NETWORK])
    if dns is not True:
        run(["podman", "network", "create", NETWORK])
        if network_dns(run(["podman", "network", "inspect", NETWORK]).stdout) is not True:
            backend = run(["podman", "info", "--format", "{{.Host.NetworkBackend}}"]).stdout.strip()
            raise LabError(f"podman created network {NETWORK} without DNS (network backend {backend!r}): the node "
                           f"containers could not resolve {MIRROR_SERVER}. Run `labctl prereqs` (it installs netavark "
                           f"and aardvark-dns and sets network_backend = \"netavark\"), then `labctl up` again.")
        log(f"created podman network {NETWORK} (DNS on)")


def answers(name: str) -> bool:
    """Whether a command can run in the container (a container podman lists as running may be a leftover)."""
    return run(["podman", "exec", name, "true"], check=False).returncode == 0


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
    run(["podman", "exec", name, "sh", "-c", f"mkdir -p {os.path.dirname(KERNEL_LOG)} && touch {KERNEL_LOG}"])


# The node containers share the host's kernel, so the driver's Xid reports of a simulated GPU cannot go to a kernel
# log of their own: `labctl fault` writes them, in the journal's short-iso format, to this file, which the lab
# inventory has the gpu_health role read (gpu_health_kernel_log: file). A DOUBLE of the kernel log, for the lab only.
KERNEL_LOG = "/var/log/gpu-lab/kern.log"
XID_DETAILS = {48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition "
                   "0, subpartition 0.", 79: "GPU has fallen off the bus.", 94: "Contained: SM (0x1). RST: No, D-RST: No",
               95: "Uncontained: FBHUB. RST: Yes, D-RST: No"}


def gpu_buses(name: str) -> dict[int, str]:
    """GPU index -> PCI address as the driver prints it in an Xid (0000:5d:00), asked of the node's nvidia-smi."""
    out = run(["podman", "exec", name, "nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"]).stdout
    buses = {}
    for line in out.splitlines():
        index, _, bus = (part.strip() for part in line.partition(","))
        domain, bus_number, device = bus.split(":")
        buses[int(index)] = f"{domain[-4:]}:{bus_number}:{device.split('.')[0]}".lower()
    return buses


# What `labctl fault --gpu-process` runs on a GPU: a training job's usual name and a modest footprint.
GPU_PROCESS_NAME = "python3"
GPU_PROCESS_MIB = 1000


def merged_faults(current: Mapping[str, Any] | None, missing_gpus: Sequence[int] = (),
                  ecc_uncorrected: Mapping[int, int] | None = None, clear: bool = False,
                  mig_reset_required: bool = False, gpu_processes: Sequence[tuple[int, int]] = (),
                  nvml_library_version: str | None = None) -> dict[str, Any]:
    """The description's new `faults`: the current ones (none with clear) plus those asked for."""
    faults = {} if clear else dict(current or {})
    if missing_gpus:
        faults["missing_gpus"] = sorted(set(faults.get("missing_gpus", [])) | set(missing_gpus))
    if ecc_uncorrected:
        faults["ecc_uncorrected"] = {**faults.get("ecc_uncorrected", {}),
                                     **{str(index): count for index, count in ecc_uncorrected.items()}}
    if mig_reset_required:
        faults["mig_reset_required"] = True
    if gpu_processes:
        faults["processes"] = list(faults.get("processes", [])) + [
            {"index": index, "pid": pid, "name": GPU_PROCESS_NAME, "used_memory_mib": GPU_PROCESS_MIB}
            for index, pid in gpu_processes]
    if nvml_library_version:
        faults["nvml_library_version"] = nvml_library_version
    return faults


def set_faults(name: str, missing_gpus: Sequence[int] = (), ecc_uncorrected: Mapping[int, int] | None = None,
               xids: Sequence[tuple[int, int]] = (), clear: bool = False, mig_reset_required: bool = False,
               gpu_processes: Sequence[tuple[int, int]] = (), nvml_library_version: str | None = None) -> dict[str, Any]:
    """Inject GPU faults into a node container (the nvidia-smi double's description and the kernel log double), or
    clear them all (clear: as after the GPU was replaced and the node rebooted). The node's new faults.

    mig_reset_required makes MIG mode changes wait for a GPU reset or restart; gpu_processes ((index, pid) pairs)
    run compute processes that `nvidia-smi --query-compute-apps` lists and that hold their GPU; nvml_library_version
    plays a driver upgrade without a reboot (NVML's "Driver/library version mismatch" from then on)."""
    description = json.loads(run(["podman", "exec", name, "cat", "/etc/gpu-lab/gpus.json"]).stdout)
    faults = merged_faults(description.get("faults"), missing_gpus, ecc_uncorrected, clear, mig_reset_required,
                           gpu_processes, nvml_library_version)
    lines = []
    if xids:
        buses = gpu_buses(name)
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S+0000")
        for index, code in xids:
            if index not in buses:
                raise LabError(f"{name} has no GPU {index} (it has {', '.join(map(str, sorted(buses)))})")
            lines.append(f"{stamp} {name} kernel: NVRM: Xid (PCI:{buses[index]}): {code}, pid='<unknown>', "
                         f"name=<unknown>, {XID_DETAILS.get(code, 'Reported by labctl fault.')}")
    if faults:
        description["faults"] = faults
    else:
        description.pop("faults", None)
    run(["podman", "exec", "-i", name, "sh", "-c", "cat > /etc/gpu-lab/gpus.json"],
        input_text=json.dumps(description, indent=2) + "\n")
    if clear:
        run(["podman", "exec", name, "sh", "-c", f": > {KERNEL_LOG}"])
    if lines:
        run(["podman", "exec", "-i", name, "sh", "-c", f"cat >> {KERNEL_LOG}"], input_text="\n".join(lines) + "\n")
    return faults


def ensure_mirror_server() -> bool:
    """Serve $GPU_LAB_CACHE/mirror on the lab network, when it has been built; True when it is served."""
    mirror = cache_root() / "mirror"
    if not (mirror / "gpu-lab-mirror.asc").is_file():
        log(f"no package mirror in {mirror}: the node roles' mirror sources will fail until `make mirror` builds it")
        return False
    state = run(["podman", "container", "inspect", "--format", "{{.State.Status}}", MIRROR_SERVER],
                check=False).stdout.strip()
    if state == "running":
        return True
    if state:
        remove_containers([MIRROR_SERVER])
    run(["podman", "run", "-d", "--name", MIRROR_SERVER, "--hostname", MIRROR_SERVER, "--network", NETWORK,
         "--label", MIRROR_LABEL, "--volume", f"{mirror}:/srv/mirror:ro", IMAGE,
         "python3", "-m", "http.server", "8080", "--directory", "/srv/mirror"])
    log(f"package mirror served to the nodes at http://{MIRROR_SERVER}:8080/ from {mirror}")
    return True


def install_node_runtime(name: str) -> None:
    """Debian's containerd, installed once per node container (a no-op when it is there)."""
    packages = " ".join(NODE_RUNTIME_PACKAGES)
    script = (f"command -v containerd >/dev/null || {{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
              f"apt-get install -y -qq --no-install-recommends {packages} >/dev/null; }}")
    result = run(["podman", "exec", name, "sh", "-c", script], check=False)
    if result.returncode != 0:
        raise LabError(f"{name}: installing {packages} failed: {(result.stderr or result.stdout).strip()[-500:]}")


PROBE_TIMEOUT_S = 30


def reach_probe(url: str) -> list[str]:
    """Run in a node container (python3 is in every lab image): resolve the URL's host, then fetch the URL, retrying
    while the server starts. Prints 'ok', or 'resolve: <error>' / 'fetch: <error>' and exits 1."""
    script = (
        "import socket,sys,time,urllib.parse,urllib.request\n"
        f"url={url!r}; host=urllib.parse.urlsplit(url).hostname; deadline=time.monotonic()+{PROBE_TIMEOUT_S}\n"
        "while True:\n"
        "    try:\n"
        "        socket.getaddrinfo(host, None); stage='fetch'\n"
        "        urllib.request.urlopen(url, timeout=5).read(1); print('ok'); sys.exit(0)\n"
        "    except OSError as exc:\n"
        "        error=exc\n"
        "        stage='resolve' if isinstance(exc, socket.gaierror) else 'fetch'\n"
        "    if time.monotonic() > deadline:\n"
        "        print(f'{stage}: {error}'); sys.exit(1)\n"
        "    time.sleep(1)\n"
    )
    return ["python3", "-c", script]


def probe_problem(name: str, url: str, output: str) -> str:
    """The message for a node container that could not use the mirror at url, from reach_probe's output."""
    host = url.split("/")[2].split(":")[0]
    stage, _, error = output.strip().partition(": ")
    if stage == "resolve":
        return (f"{name}: cannot resolve {host!r} ({error}). Names resolve on the lab network only with podman's "
                f"netavark backend and aardvark-dns: run `labctl prereqs`, then `labctl down` and `labctl up`.")
    return (f"{name}: resolves {host!r} but cannot fetch {url} ({error or output.strip() or 'no output'}). Is the "
            f"mirror built (`make mirror`) and {MIRROR_SERVER} running (`podman logs {MIRROR_SERVER}`)?")


def check_nodes_reach_mirror(names: Sequence[str]) -> None:
    """Prove, before the lab reports success, that every node container resolves and reaches the package mirror the
    node roles install from. (The nodes never talk to the API server: the cluster roles run on the control host.)"""
    url = f"http://{MIRROR_SERVER}:8080/gpu-lab-mirror.asc"
    problems = []
    for name in names:
        result = run(["podman", "exec", name, *reach_probe(url)], check=False)
        if result.returncode != 0:
            problems.append(probe_problem(name, url, result.stdout or result.stderr))
    if problems:
        raise LabError("the lab's node containers cannot use the package mirror:\n" + "\n".join(problems))
    log(f"every node container resolves and reaches {url}")


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
    remove_dead_containers()
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
    mirror_served = ensure_mirror_server()
    for name in names:
        wait_for_systemd(name)
        install_node_runtime(name)
        if name in gpus:
            install_nvidia_smi_double(name, gpus[name])
    if mirror_served:
        check_nodes_reach_mirror(names)
    log(f"lab node containers up, with containerd: {', '.join(names)}")
    return names


def down() -> None:
    names = sorted(container_states())
    remove_containers([*names, MIRROR_SERVER])
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
    """Toolkit version and the runtimes wired: '1.20.2: containerd, docker (default)'."""
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
    return render_table(header, rows)


def render_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns, two spaces apart, under a header and a rule."""
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


class Reports(NamedTuple):
    """What site.yml left under reports/, each file's content (None: missing) and when it was written (epoch s)."""

    nodes: dict | None = None
    nodes_written: float | None = None
    validation: dict | None = None
    validation_written: float | None = None
    record: dict | None = None
    record_written: float | None = None


def shorten(text: object, width: int) -> str:
    """One line of at most width characters."""
    words = " ".join(str(text or "").split())
    return words if len(words) <= width else words[:width - 3] + "..."


def iso_timestamp(text: object) -> float | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def utc_text(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def written_by_run(written: float | None, record: Mapping[str, Any]) -> bool:
    """Whether a report file was written by the recorded run (after it started)."""
    started = iso_timestamp(record.get("started"))
    return written is not None and (started is None or written >= started)


def record_is_latest(record_written: float | None, nodes_written: float | None) -> bool:
    """False when nodes.json is newer than the record's last write: site.yml ran since without keeping a record (the
    callback rewrites the record after every task, so during a recorded run it is always the newer of the two)."""
    return record_written is None or nodes_written is None or record_written >= nodes_written


def recap_text(recap: Mapping[str, int]) -> str:
    """A host's recap counts, the zero ones left out but ok: 'ok=12 changed=3 failed=1'."""
    if not recap:
        return "-"
    return " ".join(f"{key}={recap.get(key, 0)}" for key in ("ok", "changed", "failed", "unreachable", "skipped",
                                                              "rescued", "ignored") if key == "ok" or recap.get(key))


def run_table(record: Mapping[str, Any]) -> str:
    """Per host: what the recorded run reached and, where it failed, why."""
    hosts: Mapping[str, Mapping[str, Any]] = record.get("hosts") or {}
    if not hosts:
        return "(no host started a task)"
    header = ("host", "state", "last play", "last task", "recap", "failure")
    rows = [(name, entry.get("state", "-"), shorten(entry.get("last_play"), 40), shorten(entry.get("last_task"), 70),
             recap_text(entry.get("recap") or {}), shorten((entry.get("failure") or {}).get("message"), 90) or "-")
            for name, entry in sorted(hosts.items())]
    return render_table(header, rows)


def run_headline(record: Mapping[str, Any]) -> str:
    """'site.yml FAILED: ...' with how many hosts failed, or 'site.yml passed: ...'."""
    playbook = os.path.basename(str(record.get("playbook") or "site.yml"))
    if record.get("check_mode"):
        playbook += " (check mode)"
    hosts: Mapping[str, Mapping[str, Any]] = record.get("hosts") or {}
    if record.get("status") == "running":
        return (f"{playbook} FAILED: it stopped part way, without a recap (killed or interrupted, or still running); "
                f"{len(hosts)} host(s) had started")
    by_state: dict[str, list[str]] = {}
    for name, entry in sorted(hosts.items()):
        by_state.setdefault(str(entry.get("state", "ok")), []).append(name)
    if record.get("status") == "ok":
        return f"{playbook} passed: {len(by_state.get('ok', []))} host(s) ok"
    counts = [f"{len(names)} {state} ({', '.join(names)})" for state, names in sorted(by_state.items())
              if state != "ok"]
    return f"{playbook} FAILED: " + ", ".join(counts + [f"{len(by_state.get('ok', []))} ok"])


def cluster_table(cluster_rows: Sequence[Mapping[str, str]]) -> str:
    """The simulated cluster's nodes alone, for when there is no host report of this run to put beside them."""
    return render_table(("node", "cluster", "GPUs advertised"),
                        [(row["name"], row.get("ready", "-"), row.get("gpus", "-")) for row in cluster_rows])


def nodes_summary(nodes_report: dict, validation: Mapping[str, object],
                  cluster_rows: Sequence[Mapping[str, str]]) -> str:
    """The closing table and the validation verdict (what a passed run shows)."""
    if not nodes_report and not cluster_rows:
        raise LabError(f"{REPORT} lists no GPU nodes and the lab cluster is not running")
    return summary_table(merge_reports(nodes_report, validation), cluster_rows) + "\n\n" + "\n".join(
        verdict_lines(validation))


def summary_text(reports: Reports, cluster_rows: Sequence[Mapping[str, str]] = ()) -> str:
    """The main job's closing summary, from what site.yml left in reports/ (no file access: see summary()).

    A passed run shows the node table and the verdict. A failed or interrupted run (the record says so), or one that
    did not write nodes.json, shows what each host reached and why it failed, and no report of an earlier run.
    """
    record = reports.record
    notes = []
    if record is not None and not record_is_latest(reports.record_written, reports.nodes_written):
        notes.append("(reports/site-run.json is older than reports/nodes.json, so site.yml ran since without a run "
                     "record: the record is not shown)")
        record = None
    if record is None:
        if reports.nodes is None:
            lines = ["site.yml has not run, or stopped before its first play: there is no reports/nodes.json and no "
                     "run record (reports/site-run.json). `make lab` runs it, its output logged to reports/site.log."]
            return "\n\n".join(lines + ([cluster_table(cluster_rows)] if cluster_rows else []))
        notes = notes or [f"(no run record, reports/site-run.json: reports/nodes.json as written "
                          f"{utc_text(reports.nodes_written or 0)}, by whichever run wrote it)"]
        return "\n".join([nodes_summary(reports.nodes, reports.validation or {}, cluster_rows), *notes])
    log_line = f"log: {record.get('log') or 'not kept (GPU_RUN_LOG was not set)'}"
    nodes_current = reports.nodes is not None and written_by_run(reports.nodes_written, record)
    validation = reports.validation if written_by_run(reports.validation_written, record) else None
    if nodes_current and record.get("status") == "ok":
        return nodes_summary(reports.nodes or {}, validation or {}, cluster_rows) + "\n" + log_line
    parts = []
    if nodes_current and (reports.nodes or cluster_rows):
        parts.append(nodes_summary(reports.nodes or {}, validation or {}, cluster_rows))
    elif nodes_current:
        parts.append("reports/nodes.json: lists no GPU nodes, and the lab cluster is not running")
    else:
        if cluster_rows:
            parts.append(cluster_table(cluster_rows))
        if reports.nodes is None:
            parts.append("reports/nodes.json: not written by this run (site.yml did not reach playbooks/report.yml)")
        else:
            started = utc_text(iso_timestamp(record.get("started")) or 0)
            parts.append(f"reports/nodes.json: from an earlier run (written {utc_text(reports.nodes_written or 0)}, "
                         f"before this run started at {started}): not shown")
    parts.append("What site.yml reached, per host (reports/site-run.json):\n" + run_table(record))
    parts.append("\n".join([run_headline(record), log_line, "record: reports/site-run.json"]))
    return "\n\n".join(parts)


def read_report(path: Path) -> tuple[dict | None, float | None]:
    """A JSON report and its modification time; (None, None) when it is missing."""
    if not path.exists():
        return None, None
    written = path.stat().st_mtime
    try:
        return json.loads(path.read_text(encoding="utf-8")), written
    except ValueError as error:
        raise LabError(f"{path} is not JSON ({error}): run playbooks/site.yml again") from error


def summary(cluster_rows: Sequence[Mapping[str, str]] = ()) -> str:
    nodes_report, nodes_written = read_report(REPORT)
    validation, validation_written = read_report(VALIDATION)
    record, record_written = read_report(RUN_RECORD)
    return summary_text(Reports(nodes_report, nodes_written, validation, validation_written, record, record_written),
                        cluster_rows)
