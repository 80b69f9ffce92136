"""`labctl cache-dirs`, `promtool`, `containerd2` and the unit tests' oracles (`cdi-validate`, `device-plugin-config`,
`nvml-mig-mocks`, `kueue-validate`): what the tests use besides the lab itself.

The apt archive caches Molecule mounts into test hosts, promtool built from Prometheus's Go source and prometheus
unpacked from Debian's package (through the mirror's private apt tree, lab/mirror.py), and containerd 2.x built from its
Go source (lab/gobuild.py): the 2.2 line (config version 3) and the 2.4 line (config version 4); and the unit tests'
oracles, programs of ours built against upstream modules (lab/go/<name>).

Standard library only: it runs with plain ``python3`` on a brand-new Debian 12 host.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import gobuild
from _common import (
    LabError,
    cache_root,
    debian_mirror,
    device_plugin_config_check_path,
    file_lock,
    kueue_validate_path,
    log,
    require_root,
    require_tools,
    run,
)
from images import IMAGE_SUITES
from mirror import apt_get, deb_filename_parts, download_debs, parse_print_uris, prepare_apt_state, refresh_lists

# --- cache-dirs ---------------------------------------------------------------------

# Scenarios with large downloads keep their own apt archive cache, so they get their own lane in
# tests/run_molecule.py instead of waiting behind every scenario of their OS.
EXTRA_APT_ARCHIVES = ("debian12-cuda", "debian12-ctk", "debian13-ctk")


def apt_archive_dirs(root: Path) -> dict[str, Path]:
    return {key: root / "apt-archives" / key for key in (*IMAGE_SUITES, *EXTRA_APT_ARCHIVES)}


def cmd_cache_dirs(_args: argparse.Namespace) -> None:
    for path in apt_archive_dirs(cache_root()).values():
        (path / "partial").mkdir(parents=True, exist_ok=True)
        print(path, flush=True)


# --- promtool -----------------------------------------------------------------------

# promtool checks the Prometheus role's configuration and alert rules: it is built from the Go module of the line the
# role's image pins (lab/go/prometheus, 3.x; gobuild.py), since Debian ships only 2.x. A real Prometheus answers the
# GPU health check's queries in its tests (roles/gpu_health, gpu_health_prometheus_url): Debian's, whose .deb is
# fetched through the private apt tree (so the host's apt sources and dpkg state are untouched, and no Prometheus
# service is installed) and only its binary unpacked; a server built from the Go module would lack its web UI assets.
PROMTOOL_SUITE = "trixie"
# Tool name -> (Debian package, the binary in it).
DEBIAN_TOOLS = {"prometheus": ("prometheus", "./usr/bin/prometheus")}

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


def ensure_debian_tool(name: str, refresh: bool = False) -> Path:
    """$GPU_LAB_CACHE/bin/<name>, unpacked from its Debian package of PROMTOOL_SUITE (one version kept per link)."""
    package, member = DEBIAN_TOOLS[name]
    cache = cache_root()
    state = cache / "mirror-apt" / PROMTOOL_SUITE
    with file_lock(cache / f".mirror-{PROMTOOL_SUITE}.lock", f"apt lists {PROMTOOL_SUITE}"):
        env, sources_changed = prepare_apt_state(state, debian_mirror(), PROMTOOL_SUITE)
        refresh_lists(state, env, force=refresh or sources_changed)
        found = parse_print_uris(apt_get(env, "-qq", "--print-uris", "download", package).stdout)
        if len(found) != 1:
            raise LabError(f"apt-get --print-uris download {package} printed {len(found)} packages, not 1")
        deb = found[0]
        _, version, _ = deb_filename_parts(deb.filename)
        binary = cache / "bin" / f"{name}-{version.replace(':', '_')}" / name
        if not binary.is_file():
            download_debs([deb], cache / "tool-downloads", env)
            extract_member(cache / "tool-downloads" / deb.filename, member, binary)
        link = cache / "bin" / name  # what _common.prometheus_path() gives the tests
        point_link(link, binary)  # under the lock: `labctl prometheus` and `labctl promtool` may run side by side
    result = run([str(link), "--version"])
    log(f"{name} {version} from Debian {PROMTOOL_SUITE}: {link} ({(result.stdout or result.stderr).splitlines()[0].strip()})")
    return link


PROMTOOL_COMPONENT = "promtool"


def ensure_promtool(refresh: bool = False) -> Path:
    """promtool of the pinned Prometheus line (built from source), and Debian's prometheus beside it."""
    ensure_debian_tool("prometheus", refresh)
    build = gobuild.ensure_builds([PROMTOOL_COMPONENT])[PROMTOOL_COMPONENT]
    link = cache_root() / "bin" / "promtool"  # what _common.promtool_path() gives the tests
    point_link(link, build.binary("promtool"))
    result = run([str(link), "--version"])
    log(f"promtool {build.version} from source: {link} ({(result.stdout or result.stderr).splitlines()[0].strip()})")
    return link


def cmd_promtool(args: argparse.Namespace) -> None:
    require_root()
    require_tools({"apt-get": "apt", "dpkg-deb": "dpkg"})
    ensure_promtool(refresh=args.refresh)


def cmd_prometheus(args: argparse.Namespace) -> None:
    """Debian's prometheus alone (seconds): what the GPU health tests query, without waiting for promtool's build."""
    require_root()
    require_tools({"apt-get": "apt", "dpkg-deb": "dpkg"})
    ensure_debian_tool("prometheus", refresh=args.refresh)


# --- containerd2 --------------------------------------------------------------------

# containerd 2.x is in no Debian release; the toolkit role's tests run its `config dump` on the files the role plans
# (tests/unit) and in Debian 13 test hosts (Molecule). Three release lines, since the config version moved between
# them: 2.2 reads and writes config version 3, 2.3 (which introduced it) and 2.4 version 4. Each is built static (CGO_ENABLED=0) from
# containerd's Go source by gobuild.py, and named by a link under $GPU_LAB_CACHE/bin: link -> gobuild component.
CONTAINERD_LINKS = {"containerd2": "containerd", "containerd2.3": "containerd-2.3", "containerd2.4": "containerd-2.4"}
CONTAINERD_COMMAND = "containerd2"


def ensure_containerd2() -> dict[str, Path]:
    """Every containerd line the tests run, built (or found in the cache) side by side, each behind its link."""
    builds = gobuild.ensure_builds(list(CONTAINERD_LINKS.values()))
    links = {}
    for name, component in CONTAINERD_LINKS.items():
        link = cache_root() / "bin" / name
        point_link(link, builds[component].binary("containerd"))
        version = run([str(link), "--version"]).stdout.strip()
        log(f"{link} -> {os.readlink(link)}: {version}")
        links[name] = link
    return links


def cmd_containerd2(_args: argparse.Namespace) -> None:
    ensure_containerd2()


# --- the unit tests' oracles -------------------------------------------------------------

# Programs of ours built against an upstream module (lab/go/<component>/main.go), each linked at a fixed path in the
# lab cache that the unit tests read (or an environment variable overrides): one build-and-link for all four.


def ensure_linked_build(component: str, binary: str, link: Path, what: str) -> Path:
    """Build `component` (cached by gobuild.py) and point `link` at its `binary`; log `what` it is and its version."""
    build = gobuild.ensure_builds([component])[component]
    point_link(link, build.binary(binary))
    log(f"{link} -> {os.readlink(link)}: {what} {build.version}")
    return link


# The CDI oracle: CDI specs judged by the CNCF container-device-interface module's own loader (lab/go/cdi-validate).
# tests/unit/test_cdi_oracle.py runs it.
CDI_VALIDATE_COMPONENT = "cdi-validate"


def ensure_cdi_validate() -> Path:
    # what _common.cdi_validate_path() gives the tests
    return ensure_linked_build(CDI_VALIDATE_COMPONENT, "cdi-validate", cache_root() / "bin" / CDI_VALIDATE_COMPONENT,
                               "tags.cncf.io/container-device-interface")


def cmd_cdi_validate(_args: argparse.Namespace) -> None:
    ensure_cdi_validate()


# The device plugin's own config loader (k8s-device-plugin api/config/v1, lab/go/device-plugin-config/main.go): the
# unit tests judge every config the project writes or accepts with it (tests/unit/test_device_plugin_oracle.py).
DEVICE_PLUGIN_CONFIG_COMPONENT = "device-plugin-config"


def ensure_device_plugin_config_check() -> Path:
    return ensure_linked_build(DEVICE_PLUGIN_CONFIG_COMPONENT, "device-plugin-config-check",
                               device_plugin_config_check_path(), "the config loader of k8s-device-plugin")


def cmd_device_plugin_config(_args: argparse.Namespace) -> None:
    ensure_device_plugin_config_check()


# The MIG tables' oracle: NVIDIA's go-nvml mock servers (dgxa100, dgxh100, dgxh200, dgxb200) asked through the NVML
# interface by a program of ours (lab/go/nvml-mig-mocks).
NVML_MIG_MOCKS = "nvml-mig-mocks"


def ensure_nvml_mig_mocks() -> Path:
    return ensure_linked_build(NVML_MIG_MOCKS, "nvml-mig-mocks", cache_root() / "bin" / NVML_MIG_MOCKS, "go-nvml")


def cmd_nvml_mig_mocks(_args: argparse.Namespace) -> None:
    ensure_nvml_mig_mocks()


# Kueue's own ClusterQueue validation (pkg/webhooks ValidateClusterQueue, what its admission webhook runs) on the
# queues the gpu_queues role renders, by a program of ours (lab/go/kueue-validate); tests/unit/test_kueue_oracle.py
# holds the role's preflight rule to it.
KUEUE_VALIDATE_COMPONENT = "kueue-validate"


def ensure_kueue_validate() -> Path:
    return ensure_linked_build(KUEUE_VALIDATE_COMPONENT, "kueue-validate", kueue_validate_path(),
                               "the ClusterQueue webhook validation of sigs.k8s.io/kueue")


def cmd_kueue_validate(_args: argparse.Namespace) -> None:
    ensure_kueue_validate()


# All four (`labctl oracles`, which `make unit` runs first): built side by side in one gobuild call, as
# `labctl build --tools` builds them, then each linked and logged by its own function above, as its own command does
# (the builds are then found in the cache, silently).
ORACLE_COMPONENTS = (CDI_VALIDATE_COMPONENT, DEVICE_PLUGIN_CONFIG_COMPONENT, NVML_MIG_MOCKS, KUEUE_VALIDATE_COMPONENT)


def ensure_oracles() -> list[Path]:
    gobuild.ensure_builds(ORACLE_COMPONENTS)
    return [ensure_cdi_validate(), ensure_device_plugin_config_check(), ensure_nvml_mig_mocks(),
            ensure_kueue_validate()]


def cmd_oracles(_args: argparse.Namespace) -> None:
    ensure_oracles()


# --- the Prometheus Operator's CRDs ----------------------------------------------------

# The monitoring roles create these kinds for an operator's stack (and detect the stack by them). The plain CRDs,
# not example/prometheus-operator-crd-full/ (the same schemas with every field description; twice the size).
PROMETHEUS_OPERATOR_CRDS = ("servicemonitors", "prometheusrules")


def prometheus_operator_crd_paths(kinds: tuple[str, ...] = PROMETHEUS_OPERATOR_CRDS) -> list[Path]:
    """The operator's own CRD files, from its Go module pinned in lab/go/prometheus-operator (checked against
    go.sum, cached in the Go module cache: only the first call reaches the Go module proxy)."""
    crd_dir = gobuild.module_source("prometheus-operator") / "example" / "prometheus-operator-crd"
    paths = [crd_dir / f"monitoring.coreos.com_{kind}.yaml" for kind in kinds]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise LabError(f"the pinned prometheus-operator module has no {', '.join(missing)}")
    return paths
