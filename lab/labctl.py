#!/usr/bin/env python3
"""labctl: build, start and inspect the lab that tests this project without GPUs or registries.

  prereqs     install podman, runc, debootstrap and friends; make podman use runc,
              cgroupfs, the file events logger and the ulimits the lab needs
  images      build the systemd base images localhost/gpu-lab-debian12:latest (bookworm)
              and localhost/gpu-lab-debian13:latest (trixie) with debootstrap
  mirror      build a signed local apt repository of Debian's real NVIDIA driver packages
              (contrib / non-free / non-free-firmware), plus NVIDIA-style flat repositories:
              the container toolkit (built from NVIDIA's Go source) with libnvidia-container
              doubles, and CUDA toolkit doubles; prove apt accepts all of it
  cache-dirs  create and print the apt archive caches Molecule mounts into test hosts
  promtool    unpack promtool from Debian's promtool package (checks the monitoring roles)
  containerd2 build containerd 2.x from its Go source (cached) -> $GPU_LAB_CACHE/bin/containerd2
  build       build kube-apiserver, kube-controller-manager, kube-scheduler, etcd and kwok
              from their Go source (cached by version)
  up          start the control plane, the simulated nodes of lab/lab.yml (kwok) with the
              device-plugin double, and the node containers; idempotent
  down        stop all of it, delete the cluster's data, remove the node containers
  reset       down, then up
  status      show components, nodes with their GPUs, endpoints and containers
  summary     print the main job's closing table, or what a failed site.yml reached per host

prereqs, images, mirror, cache-dirs, promtool and containerd2 need only the standard library (they run with plain
``python3`` on a brand-new Debian 12 host); the control-plane commands need the project's
virtualenv (the Makefile calls labctl with .venv/bin/python). Caches live under
/var/cache/gpu-lab (GPU_LAB_CACHE), the cluster's state under /var/lib/gpu-lab
(GPU_LAB_STATE); the Debian mirror is deb.debian.org (GPU_LAB_DEBIAN_MIRROR). See docs/lab.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import gzip
import json
import os
import re
import shutil
import sys
import tempfile
import time
import tomllib
import urllib.parse
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gobuild  # noqa: E402  (standard library only, like the commands that use it here)
import nodes  # noqa: E402  (the lab's node containers)
import nvidia_packages  # noqa: E402
from _common import (  # noqa: E402  (the path insert above makes _common importable)
    Heartbeat,
    LabError,
    Stopwatch,
    cache_root,
    debian_mirror,
    eprint,
    file_digest,
    file_lock,
    format_bytes,
    format_seconds,
    log,
    remove_tree,
    require_root,
    require_tools,
    run,
    sha256_bytes,
    stream,
    write_if_changed,
)

# --------------------------------------------------------------------------------------
# prereqs
# --------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------
# images
# --------------------------------------------------------------------------------------

# Bump when the build steps change in a way the recipe fields below do not capture.
IMAGE_RECIPE_VERSION = 1
IMAGE_SUITES = {"debian12": "bookworm", "debian13": "trixie"}
IMAGE_INCLUDES = (
    "python3", "systemd", "systemd-sysv", "dbus", "sudo", "ca-certificates", "iproute2", "procps", "gnupg",
    "python3-apt",  # Ansible's apt module needs it (check mode fails without it)
)
IMAGE_LABEL = "gpu-lab.recipe"
KEEP_DEBS_CONF = (
    "// gpu-lab: keep downloaded .debs; Molecule mounts a shared cache at /var/cache/apt/archives.\n"
    'Binary::apt::APT::Keep-Downloaded-Packages "true";\n'
    'APT::Keep-Downloaded-Packages "true";\n'
)


@dataclasses.dataclass(frozen=True)
class ImageRecipe:
    key: str  # debian12
    suite: str  # bookworm
    mirror: str
    includes: tuple[str, ...]
    files: tuple[tuple[str, str], ...]  # (absolute path inside the rootfs, text)

    @property
    def name(self) -> str:
        return f"gpu-lab-{self.key}"

    @property
    def ref(self) -> str:
        return f"localhost/{self.name}:latest"


def image_recipe(key: str, mirror: str) -> ImageRecipe:
    suite = IMAGE_SUITES[key]
    files = (
        ("/etc/apt/sources.list", f"deb {mirror} {suite} main\n"),
        ("/etc/apt/apt.conf.d/00gpu-lab-keep-debs", KEEP_DEBS_CONF),
    )
    return ImageRecipe(key=key, suite=suite, mirror=mirror, includes=IMAGE_INCLUDES, files=files)


def recipe_hash(recipe: ImageRecipe) -> str:
    """sha256 over everything that decides the image's content (order-insensitive where order is)."""
    document = {
        "version": IMAGE_RECIPE_VERSION,
        "suite": recipe.suite,
        "mirror": recipe.mirror,
        "includes": sorted(recipe.includes),
        "files": sorted([path, text] for path, text in recipe.files),
        "variant": "minbase",
    }
    return sha256_bytes(json.dumps(document, sort_keys=True).encode("utf-8"))


def debootstrap_command(recipe: ImageRecipe, rootfs: Path) -> list[str]:
    return [
        "debootstrap", "--variant=minbase", "--include=" + ",".join(recipe.includes),
        recipe.suite, str(rootfs), recipe.mirror,
    ]


def import_command(recipe: ImageRecipe, digest: str, tarball: Path) -> list[str]:
    return [
        "podman", "import", "--quiet",
        "--change", 'CMD ["/sbin/init"]',
        "--change", f"LABEL {IMAGE_LABEL}={digest}",
        "--change", f"LABEL gpu-lab.suite={recipe.suite}",
        str(tarball), recipe.ref,
    ]


_DEBOOTSTRAP_PER_PACKAGE = re.compile(
    r"^I: ((Retrieving|Validating) \S+ \S+|(Extracting|Unpacking|Configuring) \S+\.\.\.)$"
)


def debootstrap_milestone(line: str) -> bool:
    """Lines worth echoing: debootstrap's phases, not its hundreds of per-package lines."""
    return line.startswith(("I: ", "W: ", "E: ")) and not _DEBOOTSTRAP_PER_PACKAGE.match(line)


def is_archive_clean_hook(text: str) -> bool:
    """A docker-clean style apt hook: deletes downloaded .debs after every dpkg run."""
    return "Post-Invoke" in text and "/var/cache/apt/archives" in text


def customise_rootfs(recipe: ImageRecipe, rootfs: Path) -> None:
    for path, text in recipe.files:
        target = rootfs / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        os.chmod(target, 0o644)
    for conf in (rootfs / "etc/apt/apt.conf.d").glob("*"):
        if not conf.is_file():
            continue
        if conf.name.startswith("docker-") or is_archive_clean_hook(conf.read_text(errors="replace")):
            conf.unlink()
    # Each container must get its own machine id: an empty file makes systemd generate one at boot.
    (rootfs / "etc/machine-id").write_text("", encoding="utf-8")
    for leftover in (rootfs / "var/cache/apt/archives").glob("*.deb"):
        leftover.unlink()
    for leftover in (rootfs / "var/lib/apt/lists").glob("*_*"):
        leftover.unlink()


def image_label(ref: str) -> tuple[str | None, str | None]:
    """(image id, recipe label) of ref, or (None, None) when podman has no such image."""
    result = run(
        ["podman", "image", "inspect", "--format", "{{.Id}} {{index .Labels \"" + IMAGE_LABEL + "\"}}", ref],
        check=False,
    )
    if result.returncode != 0:
        return None, None
    image_id, _, label = result.stdout.strip().partition(" ")
    return image_id, (label if label and label != "<no value>" else None)


@dataclasses.dataclass
class ImageResult:
    ref: str
    action: str
    seconds: float


def build_rootfs_tarball(recipe: ImageRecipe, work: Path, tarball: Path, prefix: str) -> None:
    rootfs = work / "rootfs"
    remove_tree(work)
    rootfs.mkdir(parents=True)
    log(f"debootstrap {recipe.suite} from {recipe.mirror} (about a minute) ...", prefix)
    last_line = [""]

    def on_line(line: str) -> None:
        last_line[0] = line
        if debootstrap_milestone(line):
            log(line, prefix)

    timer = Stopwatch()
    with Heartbeat(lambda: f"debootstrap running {format_seconds(timer.elapsed)}: {last_line[0]}", prefix):
        stream(debootstrap_command(recipe, rootfs), on_line, log_path=work.parent / f"{recipe.name}.debootstrap.log")
    log(f"debootstrap done in {format_seconds(timer.elapsed)}; customising and packing the rootfs", prefix)
    customise_rootfs(recipe, rootfs)
    partial = tarball.with_name(tarball.name + ".partial")
    run(["tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-C", str(rootfs), "-cf", str(partial), "."])
    os.replace(partial, tarball)
    remove_tree(work)


def ensure_image(recipe: ImageRecipe, images_dir: Path, rebuild: bool) -> ImageResult:
    prefix = recipe.key
    timer = Stopwatch()
    digest = recipe_hash(recipe)
    tarball = images_dir / f"{recipe.name}-{digest}.tar"
    with file_lock(images_dir / f".{recipe.name}.lock", recipe.ref):
        old_id, label = image_label(recipe.ref)
        if label == digest and not rebuild:
            log(f"{recipe.ref} is up to date (recipe {digest[:12]})", prefix)
            return ImageResult(recipe.ref, "up to date", timer.elapsed)
        reason = "missing" if old_id is None else ("rebuild requested" if rebuild else "recipe changed")
        if rebuild or not tarball.is_file():
            build_rootfs_tarball(recipe, images_dir / f".work-{recipe.name}", tarball, prefix)
            action = "built with debootstrap"
        else:
            action = "re-imported from cache"
            log(f"{recipe.ref} {reason}; importing cached rootfs {tarball}", prefix)
        run(import_command(recipe, digest, tarball))
        new_id, new_label = image_label(recipe.ref)
        if new_label != digest:
            raise LabError(f"podman import of {recipe.ref} did not record label {IMAGE_LABEL}={digest}")
        if old_id and old_id != new_id:
            # The replaced image is ours and now untagged; keep it only while a container uses it.
            if run(["podman", "rmi", old_id], check=False).returncode != 0:
                log(f"left old image {old_id[:12]} in place (a container still uses it)", prefix)
        for stale in images_dir.glob(f"{recipe.name}-*.tar"):
            if stale != tarball:
                stale.unlink()
                log(f"removed stale cached rootfs {stale.name}", prefix)
        log(f"{recipe.ref} {action} in {format_seconds(timer.elapsed)} ({reason})", prefix)
        return ImageResult(recipe.ref, action, timer.elapsed)


def cmd_images(args: argparse.Namespace) -> None:
    require_root()
    require_tools({"podman": "podman", "debootstrap": "debootstrap", "tar": "tar"})
    keys = [args.only] if args.only else list(IMAGE_SUITES)
    mirror = debian_mirror()
    images_dir = cache_root() / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    timer = Stopwatch()
    results: dict[str, ImageResult] = {}
    failures: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {pool.submit(ensure_image, image_recipe(key, mirror), images_dir, args.rebuild): key for key in keys}
        for future in concurrent.futures.as_completed(futures):
            key = futures[future]
            try:
                results[key] = future.result()
            except LabError as exc:
                failures.append(f"{key}: {exc}")
    for key in keys:
        if key in results:
            result = results[key]
            log(f"{result.ref}: {result.action} ({format_seconds(result.seconds)})")
    log(f"images: total {format_seconds(timer.elapsed)}")
    if failures:
        raise LabError("image build failed:\n" + "\n".join(failures))


# --------------------------------------------------------------------------------------
# mirror
# --------------------------------------------------------------------------------------

MIRROR_LAYOUT_VERSION = 1
# Every branch and module flavour the nvidia_driver role's distribution catalog offers on the suite (kept in step with
# roles/nvidia_driver/vars/Debian-*.yml by tests/unit/test_labctl.py), so the mirror can serve each of them.
MIRROR_PACKAGE_SETS: dict[str, tuple[tuple[str, ...], ...]] = {
    "bookworm": (
        ("nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libnvidia-cfg1", "nvidia-persistenced"),
        ("nvidia-driver", "nvidia-open-kernel-dkms", "nvidia-smi", "libnvidia-cfg1", "nvidia-persistenced"),
        ("nvidia-tesla-470-driver", "nvidia-tesla-470-kernel-dkms", "nvidia-tesla-470-smi", "libnvidia-tesla-470-cfg1",
         "nvidia-persistenced"),
    ),
    "trixie": (
        ("nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libnvidia-cfg1", "nvidia-persistenced"),
        ("nvidia-driver", "nvidia-open-kernel-dkms", "nvidia-smi", "libnvidia-cfg1", "nvidia-persistenced"),
        ("nvidia-tesla-535-driver", "nvidia-tesla-535-kernel-dkms", "nvidia-tesla-535-smi", "libnvidia-tesla-535-cfg1",
         "nvidia-persistenced"),
    ),
}
MIRROR_VERIFY_IMAGE = {"bookworm": "debian12", "trixie": "debian13"}
MIRROR_VERIFY_INSTALL = ("nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi")
NON_MAIN_COMPONENTS = ("contrib", "non-free", "non-free-firmware")
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
KEY_FILE_NAME = "gpu-lab-mirror.asc"
KEY_UID = "gpu-lab local mirror <gpu-lab-mirror@localhost>"
STAMP_NAME = ".gpu-lab-mirror.json"
LISTS_MAX_AGE_S = 24 * 3600


def release_fields(suite: str) -> dict[str, str]:
    return {
        "Origin": "gpu-lab",
        "Label": "gpu-lab",
        "Suite": suite,
        "Codename": suite,
        "Components": "main",
        "Architectures": "amd64",
        "Description": f"gpu-lab local mirror of Debian {suite} NVIDIA driver packages",
    }


def private_sources_list(mirror: str, suite: str) -> str:
    return f"deb [signed-by={DEBIAN_KEYRING}] {mirror} {suite} main contrib non-free non-free-firmware\n"


def private_apt_conf(state: Path) -> str:
    """apt configuration that sees only our sources and an empty dpkg status (read through APT_CONFIG,
    which apt reads before /etc/apt/apt.conf.d, so pointing Dir::Etc::parts elsewhere isolates it)."""
    settings = {
        "Dir::Etc::main": str(state / "apt.conf.main"),
        "Dir::Etc::parts": str(state / "apt.conf.d"),
        "Dir::Etc::sourcelist": str(state / "sources.list"),
        "Dir::Etc::sourceparts": str(state / "sources.list.d"),
        "Dir::Etc::preferences": str(state / "preferences"),
        "Dir::Etc::preferencesparts": str(state / "preferences.d"),
        "Dir::State": str(state / "state"),
        "Dir::State::Lists": str(state / "lists"),
        "Dir::State::status": str(state / "status"),
        "Dir::State::extended_states": str(state / "state" / "extended_states"),
        "Dir::Cache": str(state / "cache"),
        "Dir::Log": str(state / "log"),
        "APT::Architecture": "amd64",
        "APT::Install-Recommends": "false",
        "APT::Sandbox::User": "root",
        "Acquire::Languages": "none",
    }
    lines = [f"{key} {json.dumps(value)};" for key, value in settings.items()]
    lines.append('APT::Architectures { "amd64"; };')
    return "\n".join(lines) + "\n"


def prepare_apt_state(state: Path, mirror: str, suite: str) -> tuple[dict[str, str], bool]:
    """Create the private apt tree; returns (environment for apt, sources changed)."""
    for sub in ("apt.conf.d", "sources.list.d", "preferences.d", "state", "lists/partial", "cache/archives/partial",
                "log"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    if not (state / "status").exists():
        (state / "status").write_text("", encoding="utf-8")
    write_if_changed(state / "apt.conf", private_apt_conf(state))
    sources_changed = write_if_changed(state / "sources.list", private_sources_list(mirror, suite))
    return {"APT_CONFIG": str(state / "apt.conf"), "LC_ALL": "C"}, sources_changed


_PRINT_URI = re.compile(r"^'(?P<url>[^']+)' (?P<filename>\S+) (?P<size>\d+)(?: (?P<hash>\S+))?$")


@dataclasses.dataclass(frozen=True)
class DebUri:
    url: str
    filename: str
    size: int
    hash_algorithm: str  # hashlib name: sha256, sha512, md5 ...
    hash_value: str

    @property
    def component(self) -> str | None:
        return pool_component(self.url)


def parse_print_uris(text: str) -> list[DebUri]:
    """Parse `apt-get --print-uris` lines: 'URL' FILENAME SIZE ALGO:HEX."""
    algorithms = {"SHA256": "sha256", "SHA512": "sha512", "SHA1": "sha1", "MD5SUM": "md5", "MD5": "md5"}
    uris = []
    for line in text.splitlines():
        match = _PRINT_URI.match(line.strip())
        if not match or not match["filename"].endswith(".deb"):
            continue
        algorithm, _, value = (match["hash"] or "").partition(":")
        if algorithm.upper() not in algorithms or not value:
            raise LabError(f"apt printed a URI without a usable checksum: {line.strip()}")
        uris.append(
            DebUri(match["url"], match["filename"], int(match["size"]), algorithms[algorithm.upper()], value.lower())
        )
    return uris


def pool_component(url: str) -> str | None:
    """Archive component a .deb comes from, read from its pool/<component>/ path."""
    match = re.search(r"/pool/([^/]+)/", urllib.parse.urlparse(url).path)
    return match.group(1) if match else None


def non_main(uris: Iterable[DebUri]) -> list[DebUri]:
    """Only what Debian's main component lacks, de-duplicated, sorted by file name."""
    unique = {uri.filename: uri for uri in uris if uri.component in NON_MAIN_COMPONENTS}
    return [unique[name] for name in sorted(unique)]


def deb_filename_parts(filename: str) -> tuple[str, str, str]:
    """pkg_1%3a2.0-1_amd64.deb -> ('pkg', '1:2.0-1', 'amd64')."""
    stem = filename.removesuffix(".deb")
    parts = stem.split("_")
    if len(parts) != 3 or not filename.endswith(".deb"):
        raise LabError(f"not a Debian package file name: {filename}")
    name, version, arch = parts
    return name, urllib.parse.unquote(version), arch


def parse_deb822(text: str) -> list[dict[str, str]]:
    """Stanzas of a Packages / Release file; continuation lines keep their newline."""
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if not line.strip():
            if current:
                stanzas.append(current)
            current, key = {}, None
        elif line[0] in " \t":
            if key is None:
                raise LabError(f"continuation line before any field: {line!r}")
            current[key] += "\n" + line.strip()
        else:
            key, sep, value = line.partition(":")
            if not sep:
                raise LabError(f"malformed deb822 line: {line!r}")
            key = key.strip()
            current[key] = value.strip()
    if current:
        stanzas.append(current)
    return stanzas


def release_checksums(release: Mapping[str, str], field: str = "SHA256") -> dict[str, tuple[int, str]]:
    entries = {}
    for line in release.get(field, "").splitlines():
        parts = line.split()
        if len(parts) == 3:
            entries[parts[2]] = (int(parts[1]), parts[0])
    return entries


def release_problems(release_text: str, expected_fields: Mapping[str, str], files: Mapping[str, bytes]) -> list[str]:
    """What is wrong with a Release file, given the index files that must be listed in it."""
    stanzas = parse_deb822(release_text)
    if len(stanzas) != 1:
        return [f"Release has {len(stanzas)} stanzas, wanted 1"]
    release = stanzas[0]
    problems = [
        f"Release {key}: {release.get(key)!r}, wanted {value!r}"
        for key, value in expected_fields.items() if release.get(key) != value
    ]
    checksums = release_checksums(release)
    for path, data in files.items():
        if path not in checksums:
            problems.append(f"Release lists no SHA256 for {path}")
        elif checksums[path] != (len(data), sha256_bytes(data)):
            problems.append(f"Release SHA256 entry for {path} does not match the file")
    return problems


def packages_summary(packages_text: str) -> tuple[int, int]:
    """(package count, total .deb bytes) of a Packages index."""
    stanzas = parse_deb822(packages_text)
    return len(stanzas), sum(int(stanza.get("Size", "0")) for stanza in stanzas)


def mirror_inputs_digest(suite: str, fingerprint: str, debs: Sequence[DebUri]) -> str:
    document = {
        "layout": MIRROR_LAYOUT_VERSION,
        "suite": suite,
        "release": release_fields(suite),
        "key": fingerprint,
        "debs": sorted([deb.filename, deb.hash_algorithm, deb.hash_value] for deb in debs),
    }
    return sha256_bytes(json.dumps(document, sort_keys=True).encode("utf-8"))


def apt_update_problems(output: str) -> list[str]:
    """Lines of `apt-get update` output that mean the repository is not cleanly trusted."""
    markers = ("NO_PUBKEY", "GPG error", "not signed", "insecure", "EXPKEYSIG", "BADSIG", "weak", "Signature")
    return [
        line.strip() for line in output.splitlines()
        if line.startswith(("W:", "E:", "Err:")) or any(marker in line for marker in markers)
    ]


_INST_LINE = re.compile(
    r"^Inst (?P<name>\S+) (?:\[[^\]]*\] )?\((?P<version>\S+) (?P<origin>[^\[]*?)\s*\[(?P<arch>[^\]]+)\]\)"
)


def parse_simulated_installs(output: str) -> dict[str, str]:
    """package -> origin text of `apt-get install -s` Inst lines (e.g. 'gpu-lab:bookworm')."""
    installs = {}
    for line in output.splitlines():
        match = _INST_LINE.match(line)
        if match:
            installs[match["name"]] = match["origin"]
    return installs


def simulated_install_problems(installs: Mapping[str, str], requested: Sequence[str]) -> list[str]:
    """Why a simulated install of requested packages does not prove the mirror serves them."""
    problems = [f"{package} is not installed" for package in requested if package not in installs]
    problems += [
        f"{package} comes from {installs[package]!r}, not gpu-lab"
        for package in requested if package in installs and "gpu-lab" not in installs[package]
    ]
    return problems


def secret_key_fingerprints(colons: str) -> list[str]:
    """Fingerprints of primary secret keys in `gpg --with-colons --list-secret-keys` output."""
    fingerprints = []
    expect_fpr = False
    for line in colons.splitlines():
        fields = line.split(":")
        if fields[0] == "sec":
            expect_fpr = True
        elif fields[0] == "fpr" and expect_fpr:
            fingerprints.append(fields[9])
            expect_fpr = False
        elif fields[0] in ("ssb", "sub"):
            expect_fpr = False
    return fingerprints


class Gpg:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {"GNUPGHOME": str(home)}

    def __call__(self, *args: str, **kwargs: Any):  # noqa: ANN204
        batch = ["gpg", "--batch", "--no-tty", "--pinentry-mode", "loopback", "--passphrase", ""]
        return run([*batch, *args], env=self.env, **kwargs)

    def ensure_key(self) -> str:
        self.home.mkdir(parents=True, exist_ok=True)
        os.chmod(self.home, 0o700)
        found = secret_key_fingerprints(self("--with-colons", "--list-secret-keys").stdout)
        if found:
            return found[0]
        log(f"generating the mirror's RSA 4096 signing key in {self.home} (once)")
        self("--quick-generate-key", KEY_UID, "rsa4096", "sign", "never")
        found = secret_key_fingerprints(self("--with-colons", "--list-secret-keys").stdout)
        if not found:
            raise LabError(f"gpg generated no secret key in {self.home}")
        return found[0]

    def stop_agent(self) -> None:
        run(["gpgconf", "--kill", "gpg-agent"], env=self.env, check=False)


def apt_get(env: Mapping[str, str], *args: str, cwd: Path | None = None):  # noqa: ANN201
    return run(["apt-get", *args], env=env, cwd=cwd)


def refresh_lists(state: Path, env: Mapping[str, str], force: bool) -> None:
    stamp = state / "lists" / ".gpu-lab-updated"
    # The stamp says when, the lists say whether: a stamp beside emptied lists is not fresh.
    fresh = (stamp.exists() and time.time() - stamp.stat().st_mtime < LISTS_MAX_AGE_S
             and any((state / "lists").glob("*_Packages*")))
    if fresh and not force:
        hours = LISTS_MAX_AGE_S // 3600
        log(f"apt lists in {state / 'lists'} are less than {hours} h old; not updating (use --refresh)")
        return
    log("apt-get update (private configuration: main contrib non-free non-free-firmware) ...")
    result = apt_get(env, "update")
    problems = apt_update_problems(result.stdout + result.stderr)
    if problems:
        raise LabError("apt-get update of the private Debian lists reported:\n" + "\n".join(problems))
    stamp.touch()


def resolve_closure(env: Mapping[str, str], suite: str) -> list[DebUri]:
    uris: list[DebUri] = []
    for package_set in MIRROR_PACKAGE_SETS[suite]:
        result = apt_get(env, "-qq", "--print-uris", "install", "--no-install-recommends", *package_set)
        found = parse_print_uris(result.stdout)
        if not found:
            raise LabError(f"apt-get --print-uris install {' '.join(package_set)} printed no packages")
        kept = non_main(found)
        log(f"closure of {' '.join(package_set)}: {len(found)} packages, {len(kept)} outside main")
        uris += kept
    return non_main(uris)


def download_debs(debs: Sequence[DebUri], downloads: Path, env: Mapping[str, str]) -> None:
    downloads.mkdir(parents=True, exist_ok=True)

    def valid(deb: DebUri) -> bool:
        path = downloads / deb.filename
        if not path.is_file() or path.stat().st_size != deb.size:
            return False
        return file_digest(path, deb.hash_algorithm) == deb.hash_value

    todo = [deb for deb in debs if not valid(deb)]
    if not todo:
        log(f"all {len(debs)} .debs already in {downloads}")
        return
    total = sum(deb.size for deb in todo)
    log(f"downloading {len(todo)} .debs ({format_bytes(total)}) into {downloads}; {len(debs) - len(todo)} cached")
    specs = []
    for deb in todo:
        name, version, arch = deb_filename_parts(deb.filename)
        specs.append(f"{name}:{arch}={version}" if arch != "all" else f"{name}={version}")
    def progress() -> str:
        return f"still downloading ({format_bytes(sum(p.stat().st_size for p in downloads.glob('*.deb')))} in cache)"

    with Heartbeat(progress):
        apt_get(env, "-q", "download", *specs, cwd=downloads)
    bad = [deb.filename for deb in todo if not valid(deb)]
    if bad:
        for name in bad:
            (downloads / name).unlink(missing_ok=True)
        raise LabError("downloaded .debs missing or failing their checksum: " + ", ".join(bad))


def lay_out_pool(debs: Sequence[DebUri], downloads: Path, pool: Path) -> None:
    pool.mkdir(parents=True, exist_ok=True)
    wanted = {deb.filename for deb in debs}
    for existing in pool.glob("*.deb"):
        if existing.name not in wanted:
            existing.unlink()
    for deb in debs:
        target = pool / deb.filename
        source = downloads / deb.filename
        if target.exists() and target.stat().st_ino == source.stat().st_ino:
            continue
        target.unlink(missing_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)


def write_indexes(dest: Path, suite: str, gpg: Gpg, fingerprint: str) -> None:
    dist = dest / "dists" / suite
    binary = dist / "main" / "binary-amd64"
    binary.mkdir(parents=True, exist_ok=True)
    packages = run(["apt-ftparchive", "packages", "pool/main"], cwd=dest).stdout
    write_if_changed(binary / "Packages", packages)
    write_if_changed(binary / "Packages.gz", gzip.compress(packages.encode("utf-8"), mtime=0))
    for old in ("Release", "InRelease", "Release.gpg"):
        (dist / old).unlink(missing_ok=True)
    options = [f"-oAPT::FTPArchive::Release::{key}={value}" for key, value in release_fields(suite).items()]
    release = run(["apt-ftparchive", *options, "release", f"dists/{suite}"], cwd=dest).stdout
    index_files = {
        "main/binary-amd64/Packages": (binary / "Packages").read_bytes(),
        "main/binary-amd64/Packages.gz": (binary / "Packages.gz").read_bytes(),
    }
    problems = release_problems(release, release_fields(suite), index_files)
    if problems:
        raise LabError("generated Release is wrong: " + "; ".join(problems))
    (dist / "Release").write_text(release, encoding="utf-8")
    sign_release(gpg, fingerprint, dist)


def sign_release(gpg: Gpg, fingerprint: str, directory: Path) -> None:
    """directory/Release -> InRelease (clearsigned) and Release.gpg (detached), checked once written."""
    release = directory / "Release"
    sign = ["--local-user", fingerprint, "--digest-algo", "SHA512", "--yes"]
    gpg(*sign, "--clearsign", "--output", str(directory / "InRelease"), str(release))
    gpg(*sign, "--armor", "--detach-sign", "--output", str(directory / "Release.gpg"), str(release))
    gpg("--verify", str(directory / "Release.gpg"), str(release))


# --- NVIDIA-style flat repositories (same key, same dest) ---------------------------------
#
# What NVIDIA's own repositories would serve, in their flat layout (`deb [signed-by=...] URL /`): the container
# toolkit under libnvidia-container/stable/deb/amd64/ and the CUDA toolkit under cuda/repos/<os>/x86_64/. See
# lab/nvidia_packages.py for which packages are real builds and which are lab doubles.

FLAT_LAYOUT_VERSION = 1
FLAT_STAMP_NAME = ".gpu-lab-nvidia-repos.json"
TOOLKIT_COMPONENT = "nvidia-container-toolkit"
TOOLKIT_REPO_PATH = "libnvidia-container/stable/deb/amd64"
FLAT_INDEX_FILES = ("Packages", "Packages.gz")
FLAT_SIGNED_FILES = ("Release", "InRelease", "Release.gpg")


def cuda_repo_path(os_key: str) -> str:
    return f"cuda/repos/{os_key}/x86_64"


@dataclasses.dataclass(frozen=True)
class FlatRepo:
    path: str  # below the mirror root, without slashes at either end
    label: str
    description: str
    packages: tuple[nvidia_packages.DebPackage, ...]


def flat_release_fields(repo: FlatRepo) -> dict[str, str]:
    """A flat repository's Release has no Suite/Components: apt addresses it as `URL /`."""
    return {"Origin": "gpu-lab", "Label": repo.label, "Architectures": "amd64", "Description": repo.description}


def flat_source_stanza(path: str) -> str:
    """deb822 source of one flat repository served by the verification container."""
    return (f"Types: deb\nURIs: http://127.0.0.1:8080/{path}/\nSuites: /\n"
            f"Signed-By: /etc/apt/keyrings/{KEY_FILE_NAME}\n")


def nvidia_flat_repos(go_version: str, binaries: Mapping[str, bytes], config_toml: bytes) -> list[FlatRepo]:
    version = nvidia_packages.deb_version(go_version)
    toolkit = FlatRepo(
        path=TOOLKIT_REPO_PATH,
        label="gpu-lab libnvidia-container",
        description=f"gpu-lab: NVIDIA container toolkit {version} (real Go build) with libnvidia-container doubles",
        packages=(*nvidia_packages.toolkit_packages(go_version, binaries, config_toml),
                  *nvidia_packages.libnvidia_container_packages(version)),
    )
    cuda = [
        FlatRepo(path=cuda_repo_path(os_key), label=f"gpu-lab cuda {os_key}",
                 description=f"gpu-lab: CUDA toolkit doubles in the layout of NVIDIA's {os_key} CUDA repository",
                 packages=tuple(nvidia_packages.cuda_packages(os_key)))
        for os_key in nvidia_packages.CUDA_REPOS
    ]
    return [toolkit, *cuda]


def flat_repos_digest(repos: Sequence[FlatRepo], fingerprint: str) -> str:
    document = {
        "layout": FLAT_LAYOUT_VERSION,
        "key": fingerprint,
        "repos": [[repo.path, flat_release_fields(repo), sorted(nvidia_packages.package_digest(pkg)
                                                                 for pkg in repo.packages)] for repo in repos],
    }
    return sha256_bytes(json.dumps(document, sort_keys=True).encode("utf-8"))


def toolkit_build_inputs() -> tuple[str, dict[str, bytes], bytes]:
    """(pinned version, binaries by name, default config.toml) of NVIDIA's toolkit, built or taken from the cache."""
    build = gobuild.ensure_builds([TOOLKIT_COMPONENT])[TOOLKIT_COMPONENT]
    binaries = {name: build.binary(name).read_bytes() for name in build.component.binaries}
    config = run([str(build.binary("nvidia-ctk")), "config", "default"]).stdout
    if "[nvidia-container-runtime]" not in config:
        raise LabError(f"`{build.binary('nvidia-ctk')} config default` printed no [nvidia-container-runtime] table")
    return build.version, binaries, config.encode("utf-8")


def sync_debs(repo: FlatRepo, repo_dir: Path, built: Mapping[str, str]) -> dict[str, str]:
    """Build the .debs whose inputs changed (file name -> package digest), drop the ones no longer served."""
    wanted = {pkg.filename: pkg for pkg in repo.packages}
    for existing in repo_dir.glob("*.deb"):
        if existing.name not in wanted:
            existing.unlink()
    digests = {}
    for filename, package in sorted(wanted.items()):
        digest = nvidia_packages.package_digest(package)
        if built.get(filename) != digest or not (repo_dir / filename).is_file():
            log(f"building {filename}", repo.path)
            nvidia_packages.build_deb(package, repo_dir)
        digests[filename] = digest
    return digests


def write_flat_indexes(repo: FlatRepo, repo_dir: Path, gpg: Gpg, fingerprint: str) -> None:
    """Packages, Packages.gz, Release (checked), InRelease and Release.gpg in the repository's directory."""
    packages = run(["apt-ftparchive", "packages", "."], cwd=repo_dir).stdout
    write_if_changed(repo_dir / "Packages", packages)
    write_if_changed(repo_dir / "Packages.gz", gzip.compress(packages.encode("utf-8"), mtime=0))
    for old in FLAT_SIGNED_FILES:
        (repo_dir / old).unlink(missing_ok=True)
    fields = flat_release_fields(repo)
    options = [f"-oAPT::FTPArchive::Release::{key}={value}" for key, value in fields.items()]
    release = run(["apt-ftparchive", *options, "release", "."], cwd=repo_dir).stdout
    problems = release_problems(release, fields, {name: (repo_dir / name).read_bytes() for name in FLAT_INDEX_FILES})
    if problems:
        raise LabError(f"generated Release of {repo.path} is wrong: " + "; ".join(problems))
    (repo_dir / "Release").write_text(release, encoding="utf-8")
    sign_release(gpg, fingerprint, repo_dir)


def flat_outputs_present(dest: Path, repos: Sequence[FlatRepo]) -> bool:
    return all((dest / repo.path / name).is_file() for repo in repos for name in (*FLAT_INDEX_FILES,
                                                                                 *FLAT_SIGNED_FILES)) and all(
        (dest / repo.path / pkg.filename).is_file() for repo in repos for pkg in repo.packages)


def ensure_flat_repos(dest: Path, repos: Sequence[FlatRepo], gpg: Gpg, fingerprint: str,
                      force: bool) -> dict[str, Any]:
    """Lay out and sign every flat repository unless the stamp says nothing changed; returns the stamp."""
    stamp_path = dest / FLAT_STAMP_NAME
    stamp = json.loads(stamp_path.read_text()) if stamp_path.is_file() else {}
    digest = flat_repos_digest(repos, fingerprint)
    if stamp.get("inputs") == digest and flat_outputs_present(dest, repos) and not force:
        log(f"NVIDIA flat repositories in {dest} are up to date (inputs {digest[:12]})")
        return stamp
    built = stamp.get("debs", {}) if not force else {}
    debs: dict[str, str] = {}
    for repo in repos:
        repo_dir = dest / repo.path
        repo_dir.mkdir(parents=True, exist_ok=True)
        for filename, deb_digest in sync_debs(repo, repo_dir, built.get(repo.path, {})).items():
            debs.setdefault(repo.path, {})[filename] = deb_digest
        write_flat_indexes(repo, repo_dir, gpg, fingerprint)
        log(f"signed flat repository {repo.path}/ ({len(repo.packages)} packages)")
    stamp = {"inputs": digest, "debs": debs, "verified": False}
    write_if_changed(stamp_path, json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    return stamp


def flat_verify_installs(toolkit_version: str, os_key: str) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(apt-get install arguments, packages that must come from gpu-lab) for the flat repositories."""
    toolkit = (("nvidia-container-toolkit=" + toolkit_version,),
               ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
                "libnvidia-container1"))
    return [toolkit, *(((name,), (name,)) for name in nvidia_packages.CUDA_REPOS[os_key])]


def verify_flat_repos(exec_in: Any, toolkit_version: str, os_key: str) -> None:
    """Resolve the toolkit and each CUDA double from the flat repositories, then install two for real."""
    for arguments, from_gpu_lab in flat_verify_installs(toolkit_version, os_key):
        simulate = exec_in("apt-get", "install", "-s", "--no-install-recommends", *arguments)
        installs = parse_simulated_installs(simulate.stdout)
        problems = simulated_install_problems(installs, from_gpu_lab)
        if problems:
            raise LabError(f"apt-get install -s {' '.join(arguments)} did not resolve from the flat repositories: "
                           + "; ".join(problems) + "\n" + simulate.stdout[-3000:])
        log(f"container: apt resolves {' '.join(arguments)} from gpu-lab ({len(installs)} packages)")
    cuda = nvidia_packages.CUDA_RELEASES["cuda-toolkit-12-8"]
    exec_in("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-q", "-y", "--no-install-recommends",
            cuda.package, "nvidia-container-toolkit=" + toolkit_version)
    nvcc = exec_in("/usr/local/cuda/bin/nvcc", "--version").stdout
    if f"release {cuda.series}, V{cuda.nvcc_version}" not in nvcc:
        raise LabError(f"after installing {cuda.package}, /usr/local/cuda/bin/nvcc --version printed:\n{nvcc}")
    ctk = exec_in("nvidia-ctk", "--version").stdout
    if toolkit_version.split("-")[0] not in ctk:
        raise LabError(f"installed nvidia-ctk --version does not name {toolkit_version}: {ctk.strip()}")
    log(f"container: installed {cuda.package} (/usr/local/cuda -> {cuda.prefix}) and nvidia-container-toolkit; "
        f"{ctk.splitlines()[0].strip()}")


def verify_mirror(dest: Path, suite: str, toolkit_version: str) -> None:
    """Prove apt in a throwaway lab container trusts the mirror and its flat repositories and resolves the driver,
    the container toolkit and the CUDA doubles from them."""
    require_tools({"podman": "podman", "debootstrap": "debootstrap", "tar": "tar"})
    recipe = image_recipe(MIRROR_VERIFY_IMAGE[suite], debian_mirror())
    (cache_root() / "images").mkdir(parents=True, exist_ok=True)
    ensure_image(recipe, cache_root() / "images", rebuild=False)  # a no-op when `images` already built it
    ref = recipe.ref
    name = f"gpu-lab-mirror-verify-{os.getpid()}"
    os_key = MIRROR_VERIFY_IMAGE[suite]
    flat_paths = (TOOLKIT_REPO_PATH, cuda_repo_path(os_key))
    sources = "\n".join([
        "Types: deb\nURIs: http://127.0.0.1:8080/\n"
        f"Suites: {suite}\nComponents: main\nSigned-By: /etc/apt/keyrings/{KEY_FILE_NAME}\n",
        *(flat_source_stanza(path) for path in flat_paths),
    ])
    timer = Stopwatch()
    log(f"verifying the mirror in container {name} from {ref}")
    run(["podman", "run", "-d", "--name", name, "--volume", f"{dest}:/srv/mirror:ro", ref])
    try:
        def exec_in(*cmd: str, **kwargs: Any):  # noqa: ANN202
            return run(["podman", "exec", *(["-i"] if "input_text" in kwargs else []), name, *cmd], **kwargs)

        # Boot must finish first: systemd-tmpfiles empties /tmp at boot ("D /tmp"), and apt-key's temporary
        # files vanish under an apt-get update run that early ("Unknown error executing apt-key").
        # Right after `podman run` even systemd's bus is missing ("Failed to connect to bus"): poll until it answers.
        state = ""
        deadline = time.monotonic() + 120
        while state not in ("running", "degraded") and time.monotonic() < deadline:
            state = exec_in("timeout", "60", "systemctl", "is-system-running", "--wait", check=False).stdout.strip()
            if state in ("", "offline", "initializing", "starting"):
                time.sleep(0.5)
            elif state not in ("running", "degraded"):
                break
        if state not in ("running", "degraded"):
            raise LabError(f"systemd in {name} did not finish booting (state {state or 'no answer'!r})")
        run(["podman", "exec", "-d", name, "python3", "-m", "http.server", "--bind", "127.0.0.1", "8080",
             "--directory", "/srv/mirror"])
        probe = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/dists/%s/InRelease')" % suite
        for _ in range(40):
            if exec_in("python3", "-c", probe, check=False).returncode == 0:
                break
            time.sleep(0.25)
        else:
            raise LabError("the http.server inside the verification container never answered on 127.0.0.1:8080")
        exec_in("mkdir", "-p", "/etc/apt/keyrings")
        exec_in("python3", "-c", "import urllib.request; urllib.request.urlretrieve("
                f"'http://127.0.0.1:8080/{KEY_FILE_NAME}', '/etc/apt/keyrings/{KEY_FILE_NAME}')")
        exec_in("sh", "-c", "cat > /etc/apt/sources.list.d/gpu-lab-mirror.sources", input_text=sources)
        log("container: apt-get update ...")
        update = exec_in("apt-get", "update")
        problems = apt_update_problems(update.stdout + update.stderr)
        if problems:
            raise LabError("apt-get update in the container did not trust the mirror cleanly:\n" + "\n".join(problems))
        for package_set in (MIRROR_VERIFY_INSTALL, *MIRROR_PACKAGE_SETS[suite]):
            simulate = exec_in("apt-get", "install", "-s", "--no-install-recommends", *package_set)
            installs = parse_simulated_installs(simulate.stdout)
            problems = simulated_install_problems(installs, package_set)
            if problems:
                raise LabError(
                    f"apt-get install -s --no-install-recommends {' '.join(package_set)} did not resolve from the "
                    "mirror: " + "; ".join(problems) + "\n" + simulate.stdout[-3000:]
                )
            from_mirror = sum("gpu-lab" in origin for origin in installs.values())
            log(f"container: apt resolves {' '.join(package_set)}: {len(installs)} packages, "
                f"{from_mirror} from gpu-lab")
        # Resolution reads only the indexes; one real fetch proves the pool serves files matching them.
        exec_in("sh", "-c", f"cd /tmp && apt-get -q download {MIRROR_VERIFY_INSTALL[0]}")
        verify_flat_repos(exec_in, toolkit_version, os_key)
        log(f"container: mirror verified in {format_seconds(timer.elapsed)}")
    finally:
        run(["podman", "rm", "-f", "-t", "0", name], check=False)


def ensure_debian_dists(dest: Path, suite: str, debs: Sequence[DebUri], downloads: Path, gpg: Gpg,
                        fingerprint: str, force: bool) -> dict[str, Any]:
    """dists/<suite> and pool/main from Debian's packages unless the stamp says nothing changed; returns the stamp."""
    digest = mirror_inputs_digest(suite, fingerprint, debs)
    stamp_path = dest / STAMP_NAME
    stamp = json.loads(stamp_path.read_text()) if stamp_path.is_file() else {}
    outputs = [dest / KEY_FILE_NAME] + [dest / "dists" / suite / f for f in ("InRelease", "Release.gpg")]
    if stamp.get("inputs") == digest and all(path.is_file() for path in outputs) and not force:
        log(f"mirror {dest} is up to date (inputs {digest[:12]})")
        return stamp
    log(f"laying out {len(debs)} packages in {dest}")
    dest.mkdir(parents=True, exist_ok=True)
    lay_out_pool(debs, downloads, dest / "pool" / "main")
    write_if_changed(dest / KEY_FILE_NAME, gpg("--armor", "--export", fingerprint).stdout)
    write_indexes(dest, suite, gpg, fingerprint)
    stamp = {"inputs": digest, "verified": False}
    write_if_changed(stamp_path, json.dumps(stamp, indent=2) + "\n")
    return stamp


def mark_verified(path: Path, stamp: dict[str, Any]) -> None:
    stamp["verified"] = True
    write_if_changed(path, json.dumps(stamp, indent=2, sort_keys=True) + "\n")


def cmd_mirror(args: argparse.Namespace) -> None:
    require_root()
    # gcc: NVIDIA's container toolkit is built with cgo.
    require_tools({"apt-get": "apt", "apt-ftparchive": "apt-utils", "gpg": "gnupg", "gpgconf": "gpgconf",
                   "dpkg-deb": "dpkg", "gcc": "gcc"})
    suite = args.suite
    cache = cache_root()
    dest = Path(args.dest).resolve() if args.dest else cache / "mirror"
    downloads = cache / "mirror-downloads"
    state = cache / "mirror-apt" / suite
    timer = Stopwatch()
    with file_lock(cache / f".mirror-{suite}.lock", f"mirror {suite}"), \
            file_lock(cache / ".mirror-nvidia.lock", "mirror flat repositories"):
        env, sources_changed = prepare_apt_state(state, debian_mirror(), suite)
        refresh_lists(state, env, force=args.refresh or sources_changed)
        debs = resolve_closure(env, suite)
        download_debs(debs, downloads, env)
        toolkit_go_version, binaries, config_toml = toolkit_build_inputs()
        repos = nvidia_flat_repos(toolkit_go_version, binaries, config_toml)
        gpg = Gpg(cache / "mirror-gnupg")
        try:
            fingerprint = gpg.ensure_key()
            stamp = ensure_debian_dists(dest, suite, debs, downloads, gpg, fingerprint, args.force)
            flat_stamp = ensure_flat_repos(dest, repos, gpg, fingerprint, args.force)
        finally:
            gpg.stop_agent()
        if args.no_verify:
            log("skipping the container check (--no-verify)")
        elif stamp.get("verified") and flat_stamp.get("verified") and not args.verify:
            log("container check already passed for these inputs (use --verify to run it again)")
        else:
            verify_mirror(dest, suite, nvidia_packages.deb_version(toolkit_go_version))
            mark_verified(dest / STAMP_NAME, stamp)
            mark_verified(dest / FLAT_STAMP_NAME, flat_stamp)
    count, size = packages_summary((dest / "dists" / suite / "main" / "binary-amd64" / "Packages").read_text())
    log(f"mirror: {count} packages, {format_bytes(size)} at {dest} (key {dest / KEY_FILE_NAME}) "
        f"in {format_seconds(timer.elapsed)}")
    for repo in repos:
        log(f"  http://127.0.0.1:8080/{repo.path}/ : " + ", ".join(
            f"{pkg.name} {pkg.version}" for pkg in repo.packages))


# --------------------------------------------------------------------------------------
# cache-dirs
# --------------------------------------------------------------------------------------


# Scenarios with large downloads keep their own apt archive cache, so they get their own lane in
# tests/run_molecule.py instead of waiting behind every scenario of their OS.
EXTRA_APT_ARCHIVES = ("debian12-cuda", "debian12-ctk", "debian13-ctk")


def apt_archive_dirs(root: Path) -> dict[str, Path]:
    return {key: root / "apt-archives" / key for key in (*IMAGE_SUITES, *EXTRA_APT_ARCHIVES)}


def cmd_cache_dirs(_args: argparse.Namespace) -> None:
    for path in apt_archive_dirs(cache_root()).values():
        (path / "partial").mkdir(parents=True, exist_ok=True)
        print(path, flush=True)


# --------------------------------------------------------------------------------------
# promtool
# --------------------------------------------------------------------------------------

# promtool checks the Prometheus role's configuration and alert rules. It comes from Debian's `promtool` package:
# the .deb is fetched through the private apt tree (so the host's apt sources and dpkg state are untouched, and no
# Prometheus service is installed) and only promtool is unpacked. trixie's 2.53 matches the role's pinned image line.
PROMTOOL_SUITE = "trixie"
PROMTOOL_PACKAGE = "promtool"
PROMTOOL_MEMBER = "./usr/bin/promtool"


def extract_member(deb: Path, member: str, dest: Path) -> None:
    """Unpack a .deb into a scratch directory and keep one file of it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as scratch:
        run(["dpkg-deb", "-x", str(deb), scratch])
        source = Path(scratch) / member
        if not source.is_file():
            raise LabError(f"{deb.name} has no {member}")
        source.chmod(0o755)
        source.replace(dest)


def point_link(link: Path, target: Path) -> None:
    """Make link a relative symlink to target (a file beside it or below its directory), replacing it if needed."""
    relative = target.relative_to(link.parent)
    if not link.is_symlink() or Path(os.readlink(link)) != relative:
        link.unlink(missing_ok=True)
        link.symlink_to(relative)


def ensure_promtool(refresh: bool = False) -> Path:
    cache = cache_root()
    state = cache / "mirror-apt" / PROMTOOL_SUITE
    with file_lock(cache / f".mirror-{PROMTOOL_SUITE}.lock", f"apt lists {PROMTOOL_SUITE}"):
        env, sources_changed = prepare_apt_state(state, debian_mirror(), PROMTOOL_SUITE)
        refresh_lists(state, env, force=refresh or sources_changed)
        found = parse_print_uris(apt_get(env, "-qq", "--print-uris", "download", PROMTOOL_PACKAGE).stdout)
        if len(found) != 1:
            raise LabError(f"apt-get --print-uris download {PROMTOOL_PACKAGE} printed {len(found)} packages, not 1")
        deb = found[0]
        _, version, _ = deb_filename_parts(deb.filename)
        binary = cache / "bin" / f"promtool-{version.replace(':', '_')}" / "promtool"
        if not binary.is_file():
            download_debs([deb], cache / "tool-downloads", env)
            extract_member(cache / "tool-downloads" / deb.filename, PROMTOOL_MEMBER, binary)
    link = cache / "bin" / "promtool"  # what _common.promtool_path() gives the tests
    point_link(link, binary)
    result = run([str(link), "--version"])
    log(f"promtool {version} from Debian {PROMTOOL_SUITE}: {link} ({result.stdout.splitlines()[0].strip()})")
    return link


def cmd_promtool(args: argparse.Namespace) -> None:
    require_root()
    require_tools({"apt-get": "apt", "dpkg-deb": "dpkg"})
    ensure_promtool(refresh=args.refresh)


# --------------------------------------------------------------------------------------
# containerd2
# --------------------------------------------------------------------------------------

# containerd 2.x (config version 3) is in no Debian release; the toolkit role's tests run its `config dump` in a
# Debian 13 test host. Built static (CGO_ENABLED=0) from containerd's Go source by gobuild.py.
CONTAINERD_COMPONENT = "containerd"
CONTAINERD_LINK = "containerd2"


def ensure_containerd2() -> Path:
    build = gobuild.ensure_builds([CONTAINERD_COMPONENT])[CONTAINERD_COMPONENT]
    link = cache_root() / "bin" / CONTAINERD_LINK
    point_link(link, build.binary("containerd"))
    version = run([str(link), "--version"]).stdout.strip()
    log(f"{link} -> {os.readlink(link)}: {version}")
    return link


def cmd_containerd2(_args: argparse.Namespace) -> None:
    ensure_containerd2()


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------


def _cluster():  # noqa: ANN202 (a module)
    """The control-plane code needs the project's virtualenv (PyYAML, cryptography, the kubernetes client)."""
    try:
        import cluster
    except ImportError as exc:
        raise LabError(f"{exc}: run `make setup` and call labctl with .venv/bin/python (the Makefile does)") from exc
    return cluster


def _config(args: argparse.Namespace):  # noqa: ANN202
    import config as lab_config

    return lab_config.load(Path(args.config)) if getattr(args, "config", None) else lab_config.load()


def node_gpus(config) -> dict[str, dict[str, Any]]:  # noqa: ANN001
    """What the nvidia-smi double in each host node prints: its pool's GPUs."""
    gpus = {}
    for name, pool in config.nodes():
        if pool.host and pool.gpu is not None:
            gpus[name] = {"node": name, "product": pool.gpu.product, "count": pool.gpu.count,
                          "memory_mib": pool.gpu.memory_mib, "mig_capable": pool.gpu.mig_capable}
    return gpus


def check_inventory(config) -> None:  # noqa: ANN001
    ansible_inventory = shutil.which("ansible-inventory")
    if ansible_inventory is None:
        raise LabError("ansible-inventory not found: run `make setup` and put .venv/bin on PATH (make lab does both)")
    listed = nodes.inventory_nodes(ansible_inventory)
    if sorted(listed) != sorted(config.host_nodes()):
        raise LabError(f"{nodes.INVENTORY} lists gpu_nodes {sorted(listed)} but lab/lab.yml's host pools make "
                       f"{sorted(config.host_nodes())}; edit one to match the other")


def cmd_build(_args: argparse.Namespace) -> None:

    timer = Stopwatch()
    builds = gobuild.ensure_builds()
    for name, build in builds.items():
        log(f"{name} {build.version}: {build.directory}")
    log(f"control-plane binaries ready in {format_seconds(timer.elapsed)}")


def cmd_up(args: argparse.Namespace) -> None:
    require_root()
    timer = Stopwatch()
    config = _config(args)
    check_inventory(config)
    cluster = _cluster()

    # The base image (debootstrap: mostly downloads) and the Go build (mostly CPU) overlap on a new machine.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        image = pool.submit(ensure_image, image_recipe("debian12", debian_mirror()), cache_root() / "images",
                            False) if config.host_nodes() else None
        builds = pool.submit(gobuild.ensure_builds)
        builds.result()
        if image is not None:
            image.result()
    cluster.control_plane_up(config, build=False)
    nodes.up(config.host_nodes(), node_gpus(config))
    log(f"lab up in {format_seconds(timer.elapsed)}")
    print(status_text(config), flush=True)


def cmd_down(args: argparse.Namespace) -> None:
    config = _config(args)
    stopped = _cluster().control_plane_down(config)
    log(f"control plane stopped: {', '.join(stopped) or 'nothing was running'}; cluster data deleted")
    nodes.down()
    # Ansible's fact cache (ansible.cfg: smart gathering, an hour) would describe the removed node containers to the
    # next run on new ones: it goes with them.
    facts = Path(__file__).resolve().parents[1] / ".cache" / "facts"
    if facts.is_dir():
        remove_tree(facts)
        log(f"removed Ansible's fact cache {facts}")


def cmd_reset(args: argparse.Namespace) -> None:
    cmd_down(args)
    cmd_up(args)


def status_text(config) -> str:  # noqa: ANN001
    cluster = _cluster()
    components = cluster.control_plane_status(config)
    rows = [{"name": c.name, "pid": str(c.pid or "-"), "health": "healthy" if c.healthy else
             ("unhealthy" if c.pid else "stopped"), "endpoint": c.endpoint} for c in components]
    parts = ["control plane:", cluster.format_table(rows, [("name", "component"), ("pid", "pid"),
                                                           ("health", "state"), ("endpoint", "endpoint")])]
    paths = cluster.Paths(cluster.state_root())
    apiserver = next(c for c in components if c.name == "kube-apiserver")
    if apiserver.healthy:
        core = cluster.kube_client(paths.admin_kubeconfig)
        parts += ["", "nodes:", cluster.format_table(cluster.node_rows(core), [
            ("name", "node"), ("pool", "pool"), ("ready", "status"), ("product", "GPU product"),
            ("gpus", "advertised")])]
        parts += ["", f"kubeconfig: {paths.admin_kubeconfig}   (export KUBECONFIG={paths.admin_kubeconfig})"]
    parts += ["", nodes.status()]
    return "\n".join(parts)


def cmd_status(args: argparse.Namespace) -> None:
    print(status_text(_config(args)), flush=True)


def cmd_summary(args: argparse.Namespace) -> None:
    """The closing summary from reports/ (nodes.json, validation.json, the run record site-run.json). A failed run is
    reported, not an error: the exit status stays 0 and `make lab` exits with site.yml's own."""
    config = _config(args)
    cluster = _cluster()
    paths = cluster.Paths(cluster.state_root())
    cluster_rows = cluster.node_rows(cluster.kube_client(paths.admin_kubeconfig)) if cluster.is_healthy(config) \
        else []
    print("\nThe lab after the main job (cluster: simulated nodes; hosts: node containers, reports/nodes.json):\n"
          + nodes.summary(cluster_rows), flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="labctl", description="Build and cache the gpu-lab test environment (see docs/lab.md)."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    prereqs = commands.add_parser("prereqs", help="install podman & co. and configure podman for the lab")
    prereqs.set_defaults(func=cmd_prereqs)
    images = commands.add_parser("images", help="build the systemd base images with debootstrap")
    images.add_argument("--only", choices=sorted(IMAGE_SUITES), help="build one image only")
    images.add_argument("--rebuild", action="store_true", help="run debootstrap again even if the recipe is unchanged")
    images.set_defaults(func=cmd_images)
    mirror = commands.add_parser("mirror", help="build the signed local apt mirror of Debian's NVIDIA packages")
    mirror.add_argument("--suite", choices=sorted(MIRROR_PACKAGE_SETS), default="bookworm")
    mirror.add_argument("--dest", help="output directory (default: $GPU_LAB_CACHE/mirror)")
    mirror.add_argument("--refresh", action="store_true", help="apt-get update the Debian lists even if fresh")
    mirror.add_argument(
        "--force", action="store_true", help="rewrite indexes and signatures even if inputs are unchanged"
    )
    checks = mirror.add_mutually_exclusive_group()
    checks.add_argument("--verify", action="store_true", help="run the container check even if it passed before")
    checks.add_argument("--no-verify", action="store_true", help="skip the container check")
    mirror.set_defaults(func=cmd_mirror)
    cache_dirs = commands.add_parser("cache-dirs", help="create and print the shared apt archive cache dirs")
    cache_dirs.set_defaults(func=cmd_cache_dirs)
    promtool = commands.add_parser("promtool", help="unpack promtool from Debian's promtool package (cached)")
    promtool.add_argument("--refresh", action="store_true", help="apt-get update the Debian lists even if fresh")
    promtool.set_defaults(func=cmd_promtool)
    commands.add_parser("build", help="build kube-apiserver & co., etcd and kwok from Go source (cached)"
                        ).set_defaults(func=cmd_build)
    commands.add_parser(CONTAINERD_LINK, help="build containerd 2.x from Go source (cached) as $GPU_LAB_CACHE/bin/"
                        "containerd2").set_defaults(func=cmd_containerd2)
    for name, func, text in (
        ("up", cmd_up, "build what is missing, start the control plane, the simulated nodes and the node containers"),
        ("down", cmd_down, "stop the control plane, delete the cluster's data and remove the node containers"),
        ("reset", cmd_reset, "down, then up: a fresh cluster and fresh node containers (builds are kept)"),
        ("status", cmd_status, "show the control plane, the nodes with their GPUs, the endpoints and containers"),
        ("summary", cmd_summary, "print the main job's closing table (cluster nodes, reports/nodes.json and, from "
         "reports/site-run.json, what a failed site.yml reached)"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("--config", help="lab configuration (default lab/lab.yml)")
        command.set_defaults(func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except LabError as exc:
        eprint(f"labctl {args.command}: error: {exc}")
        return 1
    except KeyboardInterrupt:
        eprint(f"labctl {args.command}: interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
