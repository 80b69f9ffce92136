"""`labctl prereqs`: the Debian packages the lab needs, and podman configured for the lab.

podman must use runc, cgroupfs, the file events logger, raised ulimits and the netavark network backend. The settings
go into /etc/containers/containers.conf, or into a drop-in when that file is someone else's. A move from the CNI
backend to netavark gives the user's CNI networks back under netavark and deletes CNI's idle bridges.

Standard library only: it runs with plain ``python3`` on a brand-new Debian 12 host.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import tomllib
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import nodes  # the lab's own network (nodes.NETWORK)
from _common import Heartbeat, LabError, log, require_root, require_tools, run, write_if_changed


PREREQ_PACKAGES = (
    "podman",
    # Container names resolve on a podman network only with netavark and aardvark-dns: Debian 12's podman 4.3 pulls
    # in the CNI plugins instead (no DNS), and a network created under CNI has dns_enabled false.
    "netavark",
    "aardvark-dns",
    # netavark runs the iptables command for every bridge network but does not depend on the package; the CNI
    # plugins (which did pull it in) are not installed once netavark is on the same apt line (seen in a simulated
    # install against a new machine's package list).
    "iptables",
    "runc",
    "debootstrap",
    "uidmap",
    "slirp4netns",
    "fuse-overlayfs",
    "apt-utils",  # apt-ftparchive
    "gnupg",
    "xz-utils",
)

CONTAINERS_CONF = Path("/etc/containers/containers.conf")
CONTAINERS_CONF_D = Path("/etc/containers/containers.conf.d")
VENDOR_CONTAINERS_CONF = Path("/usr/share/containers/containers.conf")
VENDOR_CONTAINERS_CONF_D = Path("/usr/share/containers/containers.conf.d")
DROPIN_NAME = "50-gpu-lab.conf"

# crun fails on these hosts ("cgroups in hybrid mode not supported"), journald is absent in
# containers, and without raised ulimits every run fails with "setrlimit ... not permitted".
REQUIRED_ENGINE = {"runtime": "runc", "cgroup_manager": "cgroupfs", "events_logger": "file"}
# The lab's node containers reach the mirror by name: only netavark (with aardvark-dns) resolves names on a network.
REQUIRED_NETWORK = {"network_backend": "netavark"}
REQUIRED_ULIMITS = ("nofile=1024:20000", "nproc=4096:4096")
# What `podman info` reports for each engine and network key, to prove the setting took effect.
PODMAN_INFO_PATHS = {
    "runtime": ("host", "ociRuntime", "name"),
    "cgroup_manager": ("host", "cgroupManager"),
    "events_logger": ("host", "eventLogger"),
    "network_backend": ("host", "networkBackend"),
}
REQUIRED_INFO = {**REQUIRED_ENGINE, **REQUIRED_NETWORK}
OWN_CONF_HEADER = "# Written by lab/labctl.py prereqs (gpu-lab)."


def missing_packages(status_by_package: Mapping[str, str | None]) -> list[str]:
    """Packages whose dpkg status is not 'install ok installed' (None: dpkg knows nothing)."""
    return [name for name, status in status_by_package.items() if (status or "").split()[-1:] != ["installed"]]


def dpkg_status(package: str) -> str | None:
    result = run(["dpkg-query", "-W", "-f=${Status}", package], check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def ulimit_name(entry: str) -> str:
    return entry.split("=", 1)[0].strip()


def merge_ulimits(existing: Sequence[str], required: Sequence[str] = REQUIRED_ULIMITS) -> list[str]:
    """Keep the user's other ulimits; ours replace entries of the same name, in place."""
    wanted = {ulimit_name(entry): entry for entry in required}
    merged: list[str] = []
    placed: set[str] = set()
    for entry in existing:
        name = ulimit_name(entry)
        if name in wanted:
            if name not in placed:
                merged.append(wanted[name])
                placed.add(name)
        else:
            merged.append(entry)
    merged.extend(entry for name, entry in wanted.items() if name not in placed)
    return merged


def merge_conf_layers(layers: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """containers.conf semantics: later files override keys of earlier ones; tables merge, arrays replace."""
    merged: dict[str, Any] = {}

    def merge_into(target: dict[str, Any], layer: Mapping[str, Any]) -> None:
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(target.get(key), dict):
                merge_into(target[key], value)
            elif isinstance(value, Mapping):
                target[key] = {}
                merge_into(target[key], value)
            else:
                target[key] = value

    for layer in layers:
        merge_into(merged, layer)
    return merged


def missing_settings(effective: Mapping[str, Any]) -> list[str]:
    """The lab's podman settings that the effective configuration lacks, as TOML key = value."""
    missing = []
    engine = effective.get("engine", {})
    for key, value in REQUIRED_ENGINE.items():
        if engine.get(key) != value:
            missing.append(f'[engine] {key} = "{value}"')
    network = effective.get("network", {})
    for key, value in REQUIRED_NETWORK.items():
        if network.get(key) != value:
            missing.append(f'[network] {key} = "{value}"')
    ulimits = effective.get("containers", {}).get("default_ulimits", [])
    for entry in REQUIRED_ULIMITS:
        if entry not in ulimits:
            missing.append(f'[containers] default_ulimits contains "{entry}"')
    return missing


def render_containers_conf(effective_without_ours: Mapping[str, Any]) -> str:
    """Our containers.conf (or drop-in): the engine keys plus the user's ulimits merged with ours."""
    ulimits = merge_ulimits(effective_without_ours.get("containers", {}).get("default_ulimits", []))
    lines = [
        f"{OWN_CONF_HEADER} Podman settings the lab's systemd test hosts need:",
        "# runc (crun fails on hybrid cgroups), cgroupfs, file events, ulimits podman may set unprivileged,",
        "# and the netavark network backend (the only one whose networks resolve container names).",
        "[containers]",
        "default_ulimits = [" + ", ".join(json.dumps(entry) for entry in ulimits) + "]",
        "",
        "[engine]",
    ]
    lines += [f"{key} = {json.dumps(value)}" for key, value in REQUIRED_ENGINE.items()]
    lines += ["", "[network]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in REQUIRED_NETWORK.items()]
    return "\n".join(lines) + "\n"


def read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise LabError(f"{path} is not valid TOML ({exc}); fix it before running prereqs") from exc


def conf_layers(skip: Path | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """Every containers.conf file podman reads, in the order it reads them."""
    files = [VENDOR_CONTAINERS_CONF, CONTAINERS_CONF]
    for directory in (VENDOR_CONTAINERS_CONF_D, CONTAINERS_CONF_D):
        if directory.is_dir():
            files += sorted(directory.glob("*.conf"))
    return [(path, read_toml(path)) for path in files if path.is_file() and path != skip]


def podman_info() -> dict[str, Any]:
    return json.loads(run(["podman", "info", "--format", "json"]).stdout)


def dig(data: Mapping[str, Any], path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)  # type: ignore[assignment]
    return data


def podman_reads_dropins() -> bool:
    """Ask this podman, not its version number, whether it reads /etc/containers/containers.conf.d.

    A copy of /etc/containers with a probe drop-in is bind-mounted over the real one in a
    private mount namespace, so nothing else on the host sees the probe.
    """
    current = dig(podman_info(), PODMAN_INFO_PATHS["events_logger"])
    probe_value = "none" if current != "none" else "file"
    with tempfile.TemporaryDirectory(prefix="gpu-lab-probe-") as tmp:
        probe_root = Path(tmp) / "containers"
        shutil.copytree("/etc/containers", probe_root, symlinks=True)
        (probe_root / "containers.conf.d").mkdir(exist_ok=True)
        (probe_root / "containers.conf.d" / "99-gpu-lab-probe.conf").write_text(
            f'[engine]\nevents_logger = "{probe_value}"\n', encoding="utf-8"
        )
        script = f"mount --bind {probe_root} /etc/containers && exec podman info --format json"
        result = run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
    seen = dig(json.loads(result.stdout), PODMAN_INFO_PATHS["events_logger"])
    return seen == probe_value


def check_podman_effective() -> None:
    info = podman_info()
    wrong = []
    for key, path in PODMAN_INFO_PATHS.items():
        seen = dig(info, path)
        if seen != REQUIRED_INFO[key]:
            wrong.append(f"{key}: podman info says {seen!r}, wanted {REQUIRED_INFO[key]!r}")
    if wrong:
        raise LabError("podman does not use the lab's settings after writing them: " + "; ".join(wrong))


def is_own_conf(path: Path) -> bool:
    """A containers.conf that an earlier `labctl prereqs` wrote (it may be rewritten; a user's never is)."""
    try:
        return path.read_text(encoding="utf-8").startswith(OWN_CONF_HEADER)
    except OSError:
        return False


def configure_podman() -> bool:
    """Make podman use the lab's settings without overwriting a containers.conf the user wrote."""
    if not CONTAINERS_CONF.exists() or is_own_conf(CONTAINERS_CONF):
        effective = merge_conf_layers(layer for _, layer in conf_layers(skip=CONTAINERS_CONF))
        changed = write_if_changed(CONTAINERS_CONF, render_containers_conf(effective))
        log(f"wrote {CONTAINERS_CONF}" if changed else f"podman settings: {CONTAINERS_CONF} (the lab's own) in place")
        check_podman_effective()
        return changed
    dropin = CONTAINERS_CONF_D / DROPIN_NAME
    without_ours = merge_conf_layers(layer for _, layer in conf_layers(skip=dropin))
    missing = missing_settings(without_ours)
    if not missing:
        log(f"podman settings: already satisfied by {CONTAINERS_CONF}" + (f" and {dropin}" if dropin.exists() else ""))
        return False
    wanted = render_containers_conf(without_ours)
    if dropin.is_file() and dropin.read_text(encoding="utf-8") == wanted:
        changed = False
        log(f"podman settings: {dropin} already in place")
    else:
        log(f"{CONTAINERS_CONF} lacks: {'; '.join(missing)}; probing whether podman reads {CONTAINERS_CONF_D}/")
        if not podman_reads_dropins():
            raise LabError(
                f"{CONTAINERS_CONF} was written by someone else and this podman does not read drop-ins from "
                f"{CONTAINERS_CONF_D}/; add these settings to {CONTAINERS_CONF} yourself: " + "; ".join(missing)
            )
        write_if_changed(dropin, wanted)
        changed = True
        log(f"wrote {dropin} (podman reads drop-ins; {CONTAINERS_CONF} left untouched)")
    overridden = missing_settings(merge_conf_layers(layer for _, layer in conf_layers()))
    if overridden:
        raise LabError(
            f"a drop-in sorted after {DROPIN_NAME} in {CONTAINERS_CONF_D}/ overrides the lab's settings: "
            + "; ".join(overridden)
        )
    check_podman_effective()
    return changed


# The lab's own containers carry this label key (gpu-lab.role=node, =mirror); the lab's own network is nodes.NETWORK.
LAB_ROLE_LABEL = "gpu-lab.role"
# Present under every backend, so never carried over.
DEFAULT_NETWORK = "podman"


def running_containers_by_owner(containers: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """(the lab's own, everyone else's) among running containers of `podman ps --format json`."""
    lab, others = [], []
    for entry in containers:
        name = (entry.get("Names") or ["?"])[0]
        (lab if LAB_ROLE_LABEL in (entry.get("Labels") or {}) else others).append(name)
    return lab, others


def networks_to_carry(networks: Sequence[Mapping[str, Any]], lab_network: str) -> list[Mapping[str, Any]]:
    """The CNI networks netavark must get again: all but podman's default and the lab's own (`up` makes that one
    afresh, with DNS)."""
    return [net for net in networks if net.get("name") not in (DEFAULT_NETWORK, lab_network)]


def network_create_command(network: Mapping[str, Any]) -> list[str]:
    """`podman network create` for netavark that gives a CNI network back under its name, with its subnets, gateways,
    labels, options and flags; the containers attached to it find it there when they start."""
    command = ["podman", "network", "create", "--driver", str(network.get("driver") or "bridge")]
    for subnet in network.get("subnets") or []:
        command += ["--subnet", str(subnet["subnet"])]
        if subnet.get("gateway"):
            command += ["--gateway", str(subnet["gateway"])]
    if network.get("internal"):
        command.append("--internal")
    if network.get("ipv6_enabled"):
        command.append("--ipv6")
    if not network.get("dns_enabled"):
        command.append("--disable-dns")  # as it was: under CNI it had no DNS
    if (network.get("ipam_options") or {}).get("driver") == "dhcp":
        command += ["--ipam-driver", "dhcp"]
    for key, value in sorted((network.get("labels") or {}).items()):
        command += ["--label", f"{key}={value}"]
    for key, value in sorted((network.get("options") or {}).items()):
        command += ["--opt", f"{key}={value}"]
    return [*command, str(network["name"])]


def backend_move_refusal(backend: str, others_running: Sequence[str]) -> str | None:
    """Why the backend cannot be switched now, or None."""
    if not others_running:
        return None
    return (f"podman uses the {backend} network backend, and the lab needs netavark (with aardvark-dns) so its "
            f"containers resolve each other's names. These containers of yours are running: "
            f"{', '.join(sorted(others_running))}. A running container's network cannot move between backends: stop "
            f"them (`podman stop {' '.join(sorted(others_running))}`) and run `labctl prereqs` again; your containers, "
            f"images and networks are kept, and the containers start on netavark afterwards.")


def remove_cni_bridges(bridges: Sequence[str]) -> list[str]:
    """Delete the CNI backend's leftover bridges once nothing runs on them.

    CNI leaves each bridge up, with its gateway address and the route to its subnet, after its last container stops.
    netavark gives the default network (and new ones) the same subnets, so the stale bridge's route shadows the new
    one: seen here, every container on the default network lost the host's DNS and the internet ("Temporary failure
    in name resolution") and Molecule's apt updates failed. CNI makes a bridge again if it is ever used again.
    """
    removed = []
    for bridge in bridges:
        if run(["ip", "link", "show", bridge], check=False).returncode != 0:
            continue
        run(["ip", "link", "delete", bridge])
        removed.append(bridge)
    return removed


def prepare_backend_move(lab_network: str) -> tuple[str | None, list[Mapping[str, Any]]]:
    """Before netavark is configured: (backend in use, every CNI network, the default and the lab's included). Stops
    the lab's own running containers; refuses, changing nothing, while a user's container runs."""
    backend = dig(podman_info(), PODMAN_INFO_PATHS["network_backend"])
    if backend == REQUIRED_NETWORK["network_backend"]:
        return backend, []
    running = json.loads(run(["podman", "ps", "--format", "json"]).stdout or "[]")
    lab_running, others_running = running_containers_by_owner(running)
    refusal = backend_move_refusal(str(backend), others_running)
    if refusal:
        raise LabError(refusal)
    if lab_running:
        log(f"podman network backend {backend}: stopping the lab's own containers first: {', '.join(lab_running)}")
        run(["podman", "stop", *lab_running])
    return backend, json.loads(run(["podman", "network", "ls", "--format", "json"]).stdout or "[]")


def cni_bridge_links() -> list[str]:
    """Bridge interfaces named like CNI's (cni-podmanN) on this host."""
    result = run(["ip", "-o", "link", "show", "type", "bridge"], check=False)
    names = [line.split(":")[1].strip().split("@")[0] for line in result.stdout.splitlines() if ":" in line]
    return sorted(name for name in names if name.startswith("cni-podman"))


def link_has_ports(bridge: str) -> bool:
    """Whether any interface (a container's veth) is attached to the bridge."""
    return bool(run(["ip", "-o", "link", "show", "master", bridge], check=False).stdout.strip())


def carry_networks(networks: Sequence[Mapping[str, Any]]) -> list[str]:
    """Create under netavark each network the CNI backend had; returns their names."""
    carried = []
    for network in networks:
        name = str(network["name"])
        if run(["podman", "network", "exists", name], check=False).returncode == 0:
            continue
        result = run(network_create_command(network), check=False)
        if result.returncode != 0:
            raise LabError(
                f"podman now uses netavark, but the CNI network {name!r} could not be created again: "
                f"{(result.stderr or result.stdout).strip()}. Its CNI file in /etc/cni/net.d/ is untouched; create it "
                f"yourself (`podman network create ...` with the subnet shown by `podman network inspect` under CNI) "
                f"so the containers attached to it can start.")
        carried.append(name)
    return carried


def cmd_prereqs(_args: argparse.Namespace) -> None:
    require_root()
    require_tools({"dpkg-query": "dpkg", "apt-get": "apt"})
    missing = missing_packages({package: dpkg_status(package) for package in PREREQ_PACKAGES})
    changed = False
    if missing:
        log(f"installing missing Debian packages: {' '.join(missing)}")
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        with Heartbeat(lambda: "still installing packages ..."):
            run(["apt-get", "update"], env=env)
            run(["apt-get", "install", "-y", "--no-install-recommends", *missing], env=env)
        still = missing_packages({package: dpkg_status(package) for package in missing})
        if still:
            raise LabError(f"apt-get install finished but these packages are still not installed: {' '.join(still)}")
        changed = True
    else:
        log(f"Debian packages already installed: {' '.join(PREREQ_PACKAGES)}")
    backend_before, networks = prepare_backend_move(nodes.NETWORK)
    changed = configure_podman() or changed
    if backend_before != REQUIRED_NETWORK["network_backend"]:
        carried = carry_networks(networks_to_carry(networks, nodes.NETWORK))
        log(f"podman moved from the {backend_before} network backend to netavark; networks given back under their "
            f"names: {', '.join(carried) or 'none'}; the lab's own network {nodes.NETWORK} is made afresh by `up` "
            f"(CNI files in /etc/cni/net.d/ are left)")
        changed = True
    # Right after the move nothing runs on CNI's bridges; a machine moved earlier may still have some: either way,
    # every CNI bridge without a port goes.
    removed = remove_cni_bridges([link for link in cni_bridge_links() if not link_has_ports(link)])
    if removed:
        log(f"removed CNI's idle bridges (their routes would shadow netavark's): {', '.join(removed)}")
        changed = True
    log("prereqs: changed the host" if changed else "prereqs: nothing to change")
