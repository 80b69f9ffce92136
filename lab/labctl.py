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
  promtool    build promtool (Prometheus 3.x, from Go source) and unpack prometheus from Debian's package (the
              monitoring roles' checks, the health tests)
  prometheus  unpack prometheus from Debian's package alone (seconds; the health tests, without promtool's build)
  containerd2 build containerd 2.2, 2.3 and 2.4 from their Go source (cached) -> $GPU_LAB_CACHE/bin/containerd2
              (2.2, config version 3), containerd2.3 and containerd2.4 (config version 4)
  cdi-validate  build the CDI oracle (CDI specs read by the CNCF container-device-interface module's own loader)
              from Go source (cached) -> $GPU_LAB_CACHE/bin/cdi-validate
  device-plugin-config
              build our program around the device plugin's own config loader (k8s-device-plugin
              api/config/v1, cached) -> $GPU_LAB_CACHE/bin/device-plugin-config-check
  nvml-mig-mocks
              build the program that prints NVIDIA's go-nvml MIG mocks as JSON (cached) ->
              $GPU_LAB_CACHE/bin/nvml-mig-mocks, the oracle of the MIG tables' unit test
  kueue-validate
              build our program around Kueue's own ClusterQueue webhook validation (sigs.k8s.io/kueue
              pkg/webhooks, cached) -> $GPU_LAB_CACHE/bin/kueue-validate, the oracle of the queue rule's unit test
  oracles     the four above in one command (built side by side, then linked as each of them links)
  build       build kube-apiserver, kube-controller-manager, kube-scheduler, etcd, kwok and
              Kueue from their Go source (cached by version); --tools: the tests' and
              the mirror's Go builds instead
  up          start the control plane, the simulated nodes of lab/lab.yml (kwok) with the
              device-plugin double, and the node containers; idempotent
  down        stop all of it, delete the cluster's data, remove the node containers
  reset       down, then up
  status      show components, nodes with their GPUs, endpoints and containers
  summary     print the main job's closing table, or what a failed site.yml reached per host

This file holds the command line and the cluster commands (build, up, down, reset, status, summary), which delegate
to lab/cluster.py and lab/nodes.py. The other commands live beside it: prereqs in lab/prereqs.py, images in
lab/images.py, mirror in lab/mirror.py, cache-dirs, promtool, containerd2 and the oracles (cdi-validate,
device-plugin-config, nvml-mig-mocks, kueue-validate, and oracles for all four) in lab/tools.py. Those need only the
standard library (they run with plain ``python3`` on a brand-new Debian 12 host), except that mirror reads the
nvidia_driver role's package lists with PyYAML; the control-plane commands need the project's virtualenv (the
Makefile calls labctl with .venv/bin/python). Caches live under /var/cache/gpu-lab (GPU_LAB_CACHE), the cluster's
state under /var/lib/gpu-lab (GPU_LAB_STATE); the Debian mirror is deb.debian.org (GPU_LAB_DEBIAN_MIRROR). See
docs/lab.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gobuild  # noqa: E402  (standard library only, like the commands that use it here)
import nodes  # noqa: E402  (the lab's node containers)
from _common import (  # noqa: E402  (the path insert above makes _common importable)
    LabError,
    Stopwatch,
    cache_root,
    debian_mirror,
    eprint,
    format_seconds,
    log,
    remove_tree,
    require_root,
)
from images import IMAGE_SUITES, cmd_images, ensure_image, image_recipe  # noqa: E402  (base images)
from mirror import MIRROR_SUITE_VARS, cmd_mirror  # noqa: E402  (the package mirror)
from prereqs import cmd_prereqs  # noqa: E402  (packages, podman configuration)
from tools import (  # noqa: E402  (test tools)
    CDI_VALIDATE_COMPONENT,
    CONTAINERD_COMMAND,
    KUEUE_VALIDATE_COMPONENT,
    NVML_MIG_MOCKS,
    cmd_cache_dirs,
    cmd_cdi_validate,
    cmd_containerd2,
    cmd_device_plugin_config,
    cmd_kueue_validate,
    cmd_nvml_mig_mocks,
    cmd_oracles,
    cmd_prometheus,
    cmd_promtool,
)

# --------------------------------------------------------------------------------------
# cluster commands (lab/cluster.py, lab/nodes.py)
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


def cmd_build(args: argparse.Namespace) -> None:
    timer = Stopwatch()
    if args.tools:
        names = [name for name in gobuild.COMPONENTS if name not in gobuild.CONTROL_PLANE]
    else:
        names = list(gobuild.CONTROL_PLANE)
    builds = gobuild.ensure_builds(names)
    for name, build in builds.items():
        log(f"{name} {build.version}: {build.directory}")
    log(f"Go builds ({', '.join(names)}) ready in {format_seconds(timer.elapsed)}")


# The lab inventory's fact cache (ansible.cfg), which `labctl down` removes with the node containers.
FACT_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "facts"


def cmd_up(args: argparse.Namespace) -> None:
    require_root()
    timer = Stopwatch()
    config = _config(args)
    check_inventory(config)
    cluster = _cluster()

    # The base image (debootstrap: mostly downloads) and the Go build (mostly CPU) overlap on a new machine.
    hosts = config.host_nodes() if config.node_containers else []
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        image = pool.submit(ensure_image, image_recipe("debian12", debian_mirror()), cache_root() / "images",
                            False) if hosts else None
        builds = pool.submit(gobuild.ensure_builds)
        builds.result()
        if image is not None:
            image.result()
    cluster.control_plane_up(config, build=False)
    if config.node_containers:
        nodes.up(hosts, node_gpus(config))
    else:
        log(f"node containers: not started (they belong to the lab at port offset 0; this one is at "
            f"{config.port_offset})")
    log(f"lab up in {format_seconds(timer.elapsed)}")
    print(status_text(config), flush=True)


def cmd_down(args: argparse.Namespace) -> None:
    config = _config(args)
    stopped = _cluster().control_plane_down(config)
    log(f"control plane stopped: {', '.join(stopped) or 'nothing was running'}; cluster data deleted")
    if not config.node_containers:
        # A lab beside the default one (a CI lane, a bench lab) never started the node containers: they, the mirror
        # server, the network and the default fact cache stay for the lab at offset 0.
        log(f"node containers left alone (they belong to the lab at port offset 0; this one is at "
            f"{config.port_offset})")
        return
    nodes.down()
    # Ansible's fact cache (ansible.cfg: smart gathering, an hour) would describe the removed node containers to the
    # next run on new ones: it goes with them.
    facts = FACT_CACHE
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


def _index_pair(text: str) -> tuple[int, int]:
    index, sep, value = text.partition("=")
    if not sep or not index.isdigit() or not value.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: INDEX=NUMBER such as 3=79")
    return int(index), int(value)


def _driver_version(text: str) -> str:
    if not re.match(r"^[0-9]+\.[0-9]+(\.[0-9]+)?$", text):
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: a driver version such as 550.144")
    return text


def cmd_fault(args: argparse.Namespace) -> None:
    """Inject GPU faults into a node container for the health checks (a DOUBLE: docs/gpu_health.md), or clear them."""
    if not (args.clear or args.missing_gpu or args.ecc_uncorrected or args.xid or args.mig_reset_required
            or args.gpu_process or args.version_mismatch):
        raise LabError("name a fault (--missing-gpu, --ecc-uncorrected, --xid, --mig-reset-required, --gpu-process, "
                       "--version-mismatch) or --clear")
    faults = nodes.set_faults(args.node, args.missing_gpu, dict(args.ecc_uncorrected), args.xid, args.clear,
                              args.mig_reset_required, args.gpu_process, args.version_mismatch)
    print(f"{args.node}: faults {faults or 'none'}" + (f"; Xid {', '.join(f'{c} on GPU {i}' for i, c in args.xid)} "
                                                        f"written to {nodes.KERNEL_LOG}" if args.xid else ""))


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


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------


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
    mirror.add_argument("--suite", choices=sorted(MIRROR_SUITE_VARS), default="bookworm")
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
    promtool = commands.add_parser("promtool",
                                   help="build promtool from Go source, unpack prometheus from Debian (cached)")
    promtool.add_argument("--refresh", action="store_true", help="apt-get update the Debian lists even if fresh")
    promtool.set_defaults(func=cmd_promtool)
    prometheus = commands.add_parser("prometheus", help="unpack prometheus from Debian alone (cached; no Go build)")
    prometheus.add_argument("--refresh", action="store_true", help="apt-get update the Debian lists even if fresh")
    prometheus.set_defaults(func=cmd_prometheus)
    build = commands.add_parser("build", help="build kube-apiserver & co., etcd, kwok and Kueue from Go source (cached)")
    build.add_argument("--tools", action="store_true",
                       help="the Go builds of the tests and the mirror only (promtool, containerd, the toolkit, ...)")
    build.set_defaults(func=cmd_build)
    commands.add_parser(CONTAINERD_COMMAND, help="build containerd 2.2, 2.3 and 2.4 from Go source (cached) as "
                        "$GPU_LAB_CACHE/bin/containerd2, containerd2.3 and containerd2.4").set_defaults(func=cmd_containerd2)
    commands.add_parser(CDI_VALIDATE_COMPONENT, help="build the CDI oracle (the container-device-interface module's "
                        "spec loader) from Go source (cached)").set_defaults(func=cmd_cdi_validate)
    commands.add_parser("device-plugin-config", help="build our program around the device plugin's config loader "
                        "(cached) as $GPU_LAB_CACHE/bin/device-plugin-config-check").set_defaults(
                            func=cmd_device_plugin_config)
    commands.add_parser(NVML_MIG_MOCKS, help="build the program that prints go-nvml's MIG mocks as JSON (cached) as "
                        "$GPU_LAB_CACHE/bin/nvml-mig-mocks").set_defaults(func=cmd_nvml_mig_mocks)
    commands.add_parser(KUEUE_VALIDATE_COMPONENT, help="build our program around Kueue's ClusterQueue webhook "
                        "validation (cached) as $GPU_LAB_CACHE/bin/kueue-validate").set_defaults(func=cmd_kueue_validate)
    commands.add_parser("oracles", help="build and link the unit tests' four oracles at once (cdi-validate, "
                        "device-plugin-config, nvml-mig-mocks, kueue-validate; cached)").set_defaults(func=cmd_oracles)
    fault = commands.add_parser("fault", help="inject GPU faults into a node container (nvidia-smi and kernel log "
                                "doubles) for the health checks, or --clear them")
    fault.add_argument("node", help="the node container, such as gpu-h100-0")
    fault.add_argument("--missing-gpu", type=int, action="append", default=[], metavar="INDEX",
                       help="the GPU is no longer listed (fallen off the bus)")
    fault.add_argument("--ecc-uncorrected", type=_index_pair, action="append", default=[], metavar="INDEX=COUNT",
                       help="uncorrected ECC errors on a GPU")
    fault.add_argument("--xid", type=_index_pair, action="append", default=[], metavar="INDEX=CODE",
                       help="an Xid report of the driver for a GPU in the node's kernel log")
    fault.add_argument("--mig-reset-required", action="store_true",
                       help="MIG mode changes stay pending until nvidia-smi --gpu-reset or a container restart")
    fault.add_argument("--gpu-process", type=_index_pair, action="append", default=[], metavar="INDEX=PID",
                       help=f"a compute process ({nodes.GPU_PROCESS_NAME}, {nodes.GPU_PROCESS_MIB} MiB) on a GPU: "
                            "listed by --query-compute-apps, it holds the GPU against resets and MIG changes")
    fault.add_argument("--version-mismatch", type=_driver_version, metavar="NVML_VERSION",
                       help="the NVML library is another version than the loaded kernel module (a driver upgraded "
                            "without a reboot): nvidia-smi fails with \"Driver/library version mismatch\"")
    fault.add_argument("--clear", action="store_true", help="remove every fault and empty the kernel log first")
    fault.set_defaults(func=cmd_fault)
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
