#!/usr/bin/env python3
"""Lab DOUBLE of the NVIDIA k8s-device-plugin (v0.17-v0.20) and GPU Feature Discovery (GFD). For the lab only.

The lab's GPU nodes are simulated by kwok: there is no kubelet, no GPU and no real device plugin on them. This
process stands in for the pair on every simulated GPU node. It reads the node's GPU hardware from annotations the lab
sets when it creates the node, chooses the device plugin configuration the way the plugin's config-manager sidecar
does, and writes what the real pair would publish:

* node status capacity and allocatable: `nvidia.com/gpu`, `nvidia.com/gpu.shared`, `nvidia.com/mig-<profile>`
  (and `.shared` variants), multiplied by time-slicing / MPS replicas;
* GFD labels: `nvidia.com/gpu.{product,count,replicas,sharing-strategy,memory,family,compute.*}`, the same set per
  MIG resource, `nvidia.com/mig.capable`, `nvidia.com/mig.strategy`, `nvidia.com/mps.capable`, and
  `nvidia.com/gpu.present` (set on real clusters by NFD / the GPU Operator, which the lab does not run).

Upstream behaviour it follows (k8s-device-plugin sources and README):

* Config file `version: v1`; `flags.migStrategy` none|single|mixed; `sharing.timeSlicing` or `sharing.mps` (mutually
  exclusive), each with `renameByDefault`, `failRequestsGreaterThanOne` and `resources: [{name, replicas, ...}]`.
  Replicas must be an integer >= 2. `renameByDefault: true` advertises `<name>.shared`; GFD then leaves the product
  label alone, otherwise it appends `-SHARED`. A custom `rename` and a `devices` selection are ignored with a warning
  (the plugin's DisableResourceNamingInConfig), so they are ignored here too. MPS supports only `nvidia.com/gpu` on
  full GPUs; `migStrategy: mixed` with MPS is refused at start-up.
* MIG: `single` advertises MIG devices as `nvidia.com/gpu` and needs every GPU split into one profile; `mixed`
  advertises `nvidia.com/mig-<profile>` per profile and no `nvidia.com/gpu` for MIG-enabled GPUs; `none` advertises
  whole GPUs even where MIG is enabled. The real plugin reads the layout from NVML on its node, so for a node that
  has a lab node container of the same name (the three systemd containers of lab/nodes.py) the double reads it from
  that container's nvidia-smi double (`nvidia-smi --query-gpu=index,name,mig.mode.current` and `nvidia-smi -L`, one
  `podman exec` per node, at most every --mig-refresh seconds); while such a container is down or its answer cannot
  be read, the node keeps its last advertisement. For kwok-only nodes the layout comes from the node label
  `nvidia.com/mig.config` (mig-parted config names such as `all-1g.10gb`, `all-balanced`), checked against a table
  of real profiles per product.
* Config choice: the node label `nvidia.com/device-plugin.config` names a key of the ConfigMap; unset means the
  default name. A label naming a missing key is an error (the config-manager skips reconfiguration).

Where the real plugin would fail to start (invalid config, MIG layout it cannot serve, unknown config name) the
double records the reason in the node annotation `gpu-lab.dev/device-plugin-double-error` and changes nothing else:
the node keeps its previous resources and labels. Deliberate simplifications, all documented here: a missing
ConfigMap, or a ConfigMap without the default key, means "no config" (plain GPUs); a MIG configuration on a GPU that
cannot serve it is an error (on a real cluster mig-manager would not run there); MIG memory labels are the nominal
size from the profile name (NVML reports slightly less), and per-MIG multiprocessor / engine labels, driver and CUDA
version labels are not written.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib.util
import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

LOG = logging.getLogger("device-plugin-double")

# Set by the lab on each simulated node.
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
PRODUCT_ANNOTATION = "gpu-lab.dev/gpu-product"
COUNT_ANNOTATION = "gpu-lab.dev/gpu-count"
MEMORY_ANNOTATION = "gpu-lab.dev/gpu-memory-mib"
MIG_CAPABLE_ANNOTATION = "gpu-lab.dev/mig-capable"
GPU_ANNOTATIONS = (PRODUCT_ANNOTATION, COUNT_ANNOTATION, MEMORY_ANNOTATION, MIG_CAPABLE_ANNOTATION)
# Written by the double when the real plugin would refuse to serve the node.
ERROR_ANNOTATION = "gpu-lab.dev/device-plugin-double-error"

# Read from the node, as on a real cluster.
CONFIG_LABEL = "nvidia.com/device-plugin.config"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"

RESOURCE_PREFIX = "nvidia.com/"
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_SUFFIX = ".shared"
MAX_RESOURCE_NAME_LENGTH = 63
MIG_STRATEGIES = ("none", "single", "mixed")
SHARING_KEYS = {"timeSlicing": "time-slicing", "mps": "mps"}
MERGE_PATCH = "application/merge-patch+json"
MAX_ERROR_LENGTH = 1000

# GFD label keys the double owns: <resource>.<suffix> for nvidia.com/gpu and nvidia.com/mig-<profile>, plus these.
OWNED_NODE_LABELS = frozenset({
    "nvidia.com/gpu.present", "nvidia.com/mig.capable", "nvidia.com/mig.strategy", "nvidia.com/mps.capable",
})
_OWNED_RESOURCE_LABEL = re.compile(
    r"^nvidia\.com/(gpu|mig-[0-9a-z.+-]+)\."
    r"(product|count|replicas|sharing-strategy|memory|family|compute\.major|compute\.minor"
    r"|multiprocessors|slices\.gi|slices\.ci|engines\.[a-z]+)$"
)
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DEVICE_REF = re.compile(
    r"^(\d+|\d+:\d+|GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"
    r"|MIG-(GPU-)?[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}(/\d+/\d+)?)$"
)
_MIG_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb")


# --- Hardware ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GpuHardware:
    """The GPUs of one simulated node, as the lab describes them in annotations (product is the NVML name)."""

    product: str
    count: int
    memory_mib: int
    mig_capable: bool


def hardware_from_annotations(annotations: Mapping[str, str] | None) -> GpuHardware | None:
    """The node's GPUs from its gpu-lab.dev annotations; None for a node without any (a CPU node).

    Raises ValueError naming the annotation and its value when one is missing or malformed.
    """
    annotations = annotations or {}
    present = [key for key in GPU_ANNOTATIONS if key in annotations]
    if not present:
        return None
    missing = [key for key in GPU_ANNOTATIONS if key not in annotations]
    if missing:
        raise ValueError(f"GPU annotations incomplete: {', '.join(missing)} missing (has {', '.join(present)})")
    product = str(annotations[PRODUCT_ANNOTATION]).strip()
    if not product:
        raise ValueError(f"{PRODUCT_ANNOTATION}={annotations[PRODUCT_ANNOTATION]!r}: must name the GPU product")
    count = _positive_int(annotations, COUNT_ANNOTATION)
    memory_mib = _positive_int(annotations, MEMORY_ANNOTATION)
    mig_text = str(annotations[MIG_CAPABLE_ANNOTATION]).strip().lower()
    if mig_text not in ("true", "false"):
        raise ValueError(f"{MIG_CAPABLE_ANNOTATION}={annotations[MIG_CAPABLE_ANNOTATION]!r}: must be true or false")
    return GpuHardware(product=product, count=count, memory_mib=memory_mib, mig_capable=mig_text == "true")


def _positive_int(annotations: Mapping[str, str], key: str) -> int:
    value = annotations[key]
    try:
        number = int(str(value).strip(), 10)
    except ValueError:
        raise ValueError(f"{key}={value!r}: must be a positive integer") from None
    if number < 1:
        raise ValueError(f"{key}={value!r}: must be a positive integer")
    return number


# --- MIG profiles (NVIDIA MIG user guide; mig-parted's default config names and counts) ---------------------------


@dataclasses.dataclass(frozen=True)
class MigProduct:
    """MIG profiles of one GPU product: profile -> most instances on one GPU, and the `all-balanced` layout."""

    profiles: Mapping[str, int]
    balanced: Mapping[str, int]
    compute_capability: tuple[int, int]


def _load_mig_profiles():  # noqa: ANN202 (a module)
    """The project's MIG profile tables (plugins/module_utils/mig_profiles.py, standard library only): ids, sizes,
    placements and instance limits of every GPU instance profile, the same facts the nvidia_mig role checks layouts
    with. Loaded from its file: the lab does not install the collection."""
    path = Path(__file__).resolve().parents[1] / "plugins" / "module_utils" / "mig_profiles.py"
    spec = importlib.util.spec_from_file_location("gpu_lab_mig_profiles", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


mig_profiles = _load_mig_profiles()


def _mig_product(nvml_name: str, balanced: Mapping[str, int], compute_capability: tuple[int, int]) -> MigProduct:
    """A product's profiles and their instance limits from the project's tables; the balanced layout (mig-parted's
    all-balanced) and the compute capability (GFD's labels) are the double's own."""
    return MigProduct({p.name: p.instances for p in mig_profiles.product(nvml_name).profiles}, balanced,
                      compute_capability)


# Keyed by the NVML product name, lower case, without the "NVIDIA " prefix.
MIG_PRODUCTS: Mapping[str, MigProduct] = {
    "a100-sxm4-40gb": _mig_product("NVIDIA A100-SXM4-40GB", {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}, (8, 0)),
    "a100-sxm4-80gb": _mig_product("NVIDIA A100-SXM4-80GB", {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, (8, 0)),
    "h100 80gb hbm3": _mig_product("NVIDIA H100 80GB HBM3", {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, (9, 0)),
    "h200": _mig_product("NVIDIA H200", {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}, (9, 0)),
}


def mig_product(product: str) -> MigProduct | None:
    key = product.strip().lower()
    if key.startswith("nvidia "):
        key = key[len("nvidia "):]
    return MIG_PRODUCTS.get(key)


def mig_configs(product: str) -> dict[str, dict[str, int]]:
    """The mig-parted config names the product accepts -> MIG devices per GPU (all-disabled is handled apart)."""
    known = mig_product(product)
    if known is None:
        return {}
    configs: dict[str, dict[str, int]] = {"all-enabled": {}, "all-balanced": dict(known.balanced)}
    for profile, most in known.profiles.items():
        configs["all-" + profile.replace("+", ".")] = {profile: most}
    return configs


@dataclasses.dataclass(frozen=True)
class MigLayout:
    """What mig-manager would have made of the node's GPUs: MIG on or off, and the MIG devices on each GPU."""

    config_name: str
    enabled: bool
    devices_per_gpu: Mapping[str, int]


class MigLayoutError(ValueError):
    """The node asks for a MIG layout its GPUs cannot have."""


def mig_layout(hardware: GpuHardware, node_labels: Mapping[str, str]) -> MigLayout:
    """The MIG layout chosen by `nvidia.com/mig.config`; no label (or all-disabled) means MIG off."""
    name = (node_labels or {}).get(MIG_CONFIG_LABEL, "")
    if name in ("", "all-disabled"):
        return MigLayout(config_name=name, enabled=False, devices_per_gpu={})
    if not hardware.mig_capable:
        raise MigLayoutError(f"{MIG_CONFIG_LABEL}={name}: {hardware.product} is not MIG-capable "
                             f"({MIG_CAPABLE_ANNOTATION}=false)")
    configs = mig_configs(hardware.product)
    if not configs:
        raise MigLayoutError(f"{MIG_CONFIG_LABEL}={name}: the double has no MIG profile table for "
                             f"{hardware.product} (known: {', '.join(sorted(MIG_PRODUCTS))})")
    if name not in configs:
        raise MigLayoutError(f"{MIG_CONFIG_LABEL}={name} is not a MIG configuration for {hardware.product} "
                             f"(known: all-disabled, {', '.join(sorted(configs))})")
    return MigLayout(config_name=name, enabled=True, devices_per_gpu=dict(configs[name]))


# --- MIG state read from a lab node container's nvidia-smi (double) -------------------------------------------

NODE_CONTAINER_LABEL = "gpu-lab.role=node"  # lab/nodes.py's label on the node containers
MIG_READ_SEPARATOR = "@@gpu-lab-mig@@"
# One shell call per node: modes first, then the device list (`-L` has no MIG mode; a MIG-enabled GPU may have no
# MIG devices yet).
MIG_READ_SCRIPT = ("nvidia-smi --query-gpu=index,name,mig.mode.current --format=csv,noheader && "
                   f"echo {MIG_READ_SEPARATOR} && nvidia-smi -L")
_LIST_GPU = re.compile(r"^GPU (\d+): (.+) \(UUID: GPU-[0-9a-fA-F-]+\)$")
_LIST_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: MIG-[^)]+\)$")


@dataclasses.dataclass(frozen=True)
class GpuMigState:
    """One GPU as its node's nvidia-smi reports it: MIG mode and the profiles of its MIG devices."""

    index: int
    product: str
    mig_capable: bool
    mig_enabled: bool
    profiles: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class NodeMigState:
    gpus: tuple[GpuMigState, ...]


class MigReadError(Exception):
    """A node's nvidia-smi answer could not be had or understood."""


def parse_node_mig(output: str) -> NodeMigState:
    """The answer of MIG_READ_SCRIPT: `index, name, mig.mode.current` rows, the separator, then `nvidia-smi -L`."""
    modes_text, separator, listing = output.partition(MIG_READ_SEPARATOR)
    if not separator:
        raise MigReadError(f"no {MIG_READ_SEPARATOR} line in the answer: {output.strip()[:200]!r}")
    modes: dict[int, str] = {}
    for row in modes_text.strip().splitlines():
        cells = [cell.strip() for cell in row.split(",")]
        if len(cells) < 3 or not cells[0].isdigit():
            raise MigReadError(f"unexpected --query-gpu row {row!r}")
        modes[int(cells[0])] = cells[-1]
    gpus: list[GpuMigState] = []
    for line in listing.strip().splitlines():
        gpu_match, mig_match = _LIST_GPU.match(line), _LIST_MIG.match(line)
        if gpu_match:
            index = int(gpu_match.group(1))
            mode = modes.get(index, "[N/A]")
            gpus.append(GpuMigState(index, gpu_match.group(2), mode in ("Enabled", "Disabled"), mode == "Enabled"))
        elif mig_match and gpus:
            gpus[-1] = dataclasses.replace(gpus[-1], profiles=gpus[-1].profiles + (mig_match.group(1),))
        elif line.strip():
            raise MigReadError(f"unexpected nvidia-smi -L line {line!r}")
    return NodeMigState(tuple(gpus))


Runner = Callable[..., subprocess.CompletedProcess]


class PodmanMigReader:
    """Reads MIG state from the lab's node containers with podman (the double runs on the machine that runs them)."""

    def __init__(self, podman: str = "podman", timeout_s: float = 15.0, runner: Runner = subprocess.run) -> None:
        self.podman, self.timeout_s, self.runner = podman, timeout_s, runner

    def containers(self) -> dict[str, bool]:
        """Lab node containers by name -> running. Empty without podman (no lab containers on this machine)."""
        try:
            result = self.runner([self.podman, "ps", "-a", "--filter", f"label={NODE_CONTAINER_LABEL}",
                                  "--format", "json"], capture_output=True, text=True, timeout=self.timeout_s,
                                 check=False)
        except FileNotFoundError:
            return {}
        except (OSError, subprocess.SubprocessError) as error:
            raise MigReadError(f"podman ps failed: {error}") from None
        if result.returncode != 0:
            raise MigReadError(f"podman ps failed: {result.stderr.strip()[:200]}")
        try:
            entries = json.loads(result.stdout or "[]")
            return {entry["Names"][0]: entry.get("State") == "running" for entry in entries}
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise MigReadError(f"podman ps answered something else: {error}") from None

    def read(self, name: str) -> NodeMigState:
        try:
            result = self.runner([self.podman, "exec", name, "sh", "-c", MIG_READ_SCRIPT], capture_output=True,
                                 text=True, timeout=self.timeout_s, check=False)
        except (OSError, subprocess.SubprocessError) as error:
            raise MigReadError(f"{name}: podman exec failed: {error}") from None
        if result.returncode != 0:
            raise MigReadError(f"{name}: nvidia-smi exited {result.returncode}: "
                               f"{(result.stdout + result.stderr).strip()[:200]}")
        return parse_node_mig(result.stdout)


class NodeMigStates:
    """What each lab node container's nvidia-smi says, refreshed at most every `refresh_s` seconds.

    `current(names)` maps a node that has a container to its latest reading, or to None while the container is down
    or its last read failed (the node is then left as it is); nodes without a container are not in the map.
    """

    def __init__(self, reader: Any, refresh_s: float = 10.0, clock: Callable[[], float] = time.monotonic,
                 workers: int = 4) -> None:
        self.reader, self.refresh_s, self.clock, self.workers = reader, refresh_s, clock, workers
        self._containers: dict[str, bool] = {}
        self._states: dict[str, NodeMigState | None] = {}
        self._read_at: float | None = None

    def current(self, names: Iterable[str]) -> dict[str, NodeMigState | None]:
        wanted = set(names)
        now = self.clock()
        if self._read_at is None or now - self._read_at >= self.refresh_s:
            self._read_at = now
            self._refresh(wanted)
        return {name: self._states.get(name) for name in wanted if name in self._containers}

    def _refresh(self, wanted: set[str]) -> None:
        try:
            self._containers = self.reader.containers()
        except MigReadError as error:
            LOG.warning("cannot list the lab node containers, their nodes stay as they are: %s", error)
            self._states = {name: None for name in self._containers}
            return
        running = sorted(name for name in wanted if self._containers.get(name))

        def read(name: str) -> NodeMigState | None:
            try:
                return self.reader.read(name)
            except MigReadError as error:
                LOG.warning("%s: MIG state not read, node left as it is: %s", name, error)
                return None

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, self.workers)) as pool:
            readings = dict(zip(running, pool.map(read, running)))
        self._states = {name: readings.get(name) for name in self._containers}


# --- Device plugin configuration ------------------------------------------------------------------------------


def normalise_resource_name(name: str) -> str:
    """The plugin's NewResourceName: names without the nvidia.com/ prefix get it."""
    return name if name.startswith(RESOURCE_PREFIX) else RESOURCE_PREFIX + name


def _resource_name_problem(where: str, name: Any) -> str | None:
    if not isinstance(name, str) or not name:
        return f"{where}: must be a resource name, got {name!r}"
    full = normalise_resource_name(name)
    if len(full) > MAX_RESOURCE_NAME_LENGTH:
        return f"{where}: {full!r} is longer than {MAX_RESOURCE_NAME_LENGTH} characters"
    if not _DNS_SUBDOMAIN.match(full[len(RESOURCE_PREFIX):]):
        return f"{where}: {name!r} is not a valid resource name"
    return None


def _devices_problem(where: str, devices: Any) -> str | None:
    if devices == "all":
        return None
    if isinstance(devices, int) and not isinstance(devices, bool):
        return None if devices > 0 else f"{where}: a device count must be > 0, got {devices}"
    if isinstance(devices, list):
        for item in devices:
            if isinstance(item, bool) or not (isinstance(item, int) and item >= 0
                                              or isinstance(item, str) and _DEVICE_REF.match(item)):
                return f"{where}: {item!r} is not a GPU index, MIG index or UUID"
        return None
    return f"{where}: must be 'all', a count or a list of devices, got {devices!r}"


def _is_set(mapping: Mapping[str, Any], key: str) -> bool:
    return mapping.get(key) is not None


def validate_config(config: Mapping[str, Any] | None) -> list[str]:
    """Problems that would make the real plugin (or GFD) refuse this config file; empty when it would start."""
    if config is None:
        return []
    if not isinstance(config, Mapping):
        return [f"config must be a mapping, got {type(config).__name__}"]
    problems: list[str] = []
    version = config.get("version")
    if version not in (None, "", "v1"):
        problems.append(f"version: unknown version {version!r} (only v1)")
    flags = config.get("flags")
    strategy = "none"
    if flags is not None and not isinstance(flags, Mapping):
        problems.append(f"flags: must be a mapping, got {flags!r}")
    elif flags:
        strategy = flags.get("migStrategy") or "none"
        if strategy not in MIG_STRATEGIES:
            problems.append(f"flags.migStrategy: unknown MIG strategy {strategy!r} (none, single or mixed)")
    sharing = config.get("sharing")
    if sharing is None:
        return problems
    if not isinstance(sharing, Mapping):
        return problems + [f"sharing: must be a mapping, got {sharing!r}"]
    if _is_set(sharing, "timeSlicing") and _is_set(sharing, "mps"):
        problems.append("sharing: timeSlicing and mps are mutually exclusive")
    for key in SHARING_KEYS:
        if _is_set(sharing, key):
            problems.extend(_sharing_problems(f"sharing.{key}", sharing[key], mps=key == "mps"))
    if _is_set(sharing, "mps") and strategy == "mixed":
        problems.append("sharing.mps: MPS is not supported with flags.migStrategy=mixed")
    return problems


def _sharing_problems(where: str, section: Any, mps: bool) -> list[str]:
    if not isinstance(section, Mapping):
        return [f"{where}: must be a mapping, got {section!r}"]
    problems = [f"{where}.{flag}: must be true or false, got {section[flag]!r}"
                for flag in ("renameByDefault", "failRequestsGreaterThanOne")
                if flag in section and not isinstance(section[flag], bool)]
    resources = section.get("resources")
    if not resources:
        return problems + [f"{where}.resources: no resources specified"]
    if not isinstance(resources, list):
        return problems + [f"{where}.resources: must be a list, got {resources!r}"]
    seen: set[str] = set()
    for index, resource in enumerate(resources):
        at = f"{where}.resources[{index}]"
        if not isinstance(resource, Mapping):
            problems.append(f"{at}: must be a mapping, got {resource!r}")
            continue
        name_problem = _resource_name_problem(f"{at}.name", resource.get("name"))
        if name_problem:
            problems.append(name_problem)
        else:
            name = normalise_resource_name(resource["name"])
            if name in seen:
                problems.append(f"{at}.name: {name} is listed twice")
            seen.add(name)
            if mps and name != GPU_RESOURCE:
                problems.append(f"{at}.name: MPS supports only {GPU_RESOURCE}, got {name}")
        replicas = resource.get("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 2:
            problems.append(f"{at}.replicas: must be an integer >= 2, got {replicas!r}")
        if "rename" in resource:
            rename_problem = _resource_name_problem(f"{at}.rename", resource["rename"])
            if rename_problem:
                problems.append(rename_problem)
        if "devices" in resource:
            devices_problem = _devices_problem(f"{at}.devices", resource["devices"])
            if devices_problem:
                problems.append(devices_problem)
    return problems


def _ignored_field_warnings(config: Mapping[str, Any]) -> list[str]:
    """What the plugin's DisableResourceNamingInConfig ignores, with its own wording."""
    warnings: list[str] = []
    if config.get("resources"):
        warnings.append("Customizing the 'resources' field is not yet supported in the config. Ignoring...")
    kind, section = _active_sharing(config)
    if section is None:
        return warnings
    key = next(k for k, v in SHARING_KEYS.items() if v == kind)
    default_rename = bool(section.get("renameByDefault"))
    resources = section["resources"]
    if any(r.get("rename") and (not default_rename or normalise_resource_name(r["rename"])
                                != normalise_resource_name(r["name"]) + SHARED_SUFFIX) for r in resources):
        warnings.append(f"Setting the 'rename' field in sharing.{key}.resources is not yet supported in the config. "
                        "Ignoring...")
    if any(r.get("devices", "all") != "all" for r in resources):
        warnings.append(f"Customizing the 'devices' field in sharing.{key}.resources is not yet supported in the "
                        "config. Ignoring...")
    return warnings


def _active_sharing(config: Mapping[str, Any]) -> tuple[str, Mapping[str, Any] | None]:
    """("time-slicing" | "mps" | "none", the section); call on a valid config."""
    sharing = config.get("sharing") or {}
    for key, kind in SHARING_KEYS.items():
        if _is_set(sharing, key):
            return kind, sharing[key]
    return "none", None


# --- What the plugin and GFD advertise --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Advertisement:
    """What the real pair would publish on one node. With `error` set the plugin would not start: the double
    changes nothing on the node but the error annotation, and `resources` / `labels` are empty."""

    resources: dict[str, int]
    labels: dict[str, str]
    error: str | None = None
    warnings: tuple[str, ...] = ()

    @classmethod
    def failed(cls, error: str) -> "Advertisement":
        return cls(resources={}, labels={}, error=error)


def sanitise_product(name: str) -> str:
    """GFD's product label part: characters outside [A-Za-z0-9-_. ] dropped, blanks collapsed to '-'."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", name).split())


def _arch_family(major: int, minor: int) -> str:
    families = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper"}
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return families.get(major, "undefined")


def _mig_resource_name(profile: str) -> str:
    return "nvidia.com/mig-" + profile.replace("+", ".")


def _resource_labels(resource: str, count: int, parts: Iterable[str], sharing_kind: str,
                     sharing: Mapping[str, Any] | None, with_sharing: bool) -> dict[str, str]:
    """GFD's baseLabeler: <resource>.product/count/replicas/sharing-strategy."""
    replicas, renamed = 1, False
    if not with_sharing:
        replicas = 0
    elif sharing is not None:
        for entry in sharing["resources"]:
            if normalise_resource_name(entry["name"]) == resource:
                replicas = entry["replicas"]
                renamed = bool(sharing.get("renameByDefault"))
    product_parts = [sanitise_product(part) for part in parts if part]
    if replicas > 1 and not renamed:
        product_parts.append("SHARED")
    return {
        f"{resource}.product": "-".join(product_parts),
        f"{resource}.count": str(count),
        f"{resource}.replicas": str(replicas),
        f"{resource}.sharing-strategy": sharing_kind if replicas > 1 else "none",
    }


@dataclasses.dataclass(frozen=True)
class GpuLayout:
    """The MIG layout of a node's GPUs, from the mig.config label or from the node's nvidia-smi, and where it came
    from (for messages)."""

    gpus: tuple[tuple[bool, tuple[tuple[str, int], ...]], ...]  # per GPU: MIG enabled, (profile, devices) pairs
    source: str

    @property
    def any_enabled(self) -> bool:
        return any(enabled for enabled, _ in self.gpus)


def layout_from_label(hardware: GpuHardware, node_labels: Mapping[str, str]) -> GpuLayout:
    layout = mig_layout(hardware, node_labels)  # raises MigLayoutError
    per_gpu = tuple(sorted(layout.devices_per_gpu.items()))
    return GpuLayout(((layout.enabled, per_gpu),) * hardware.count, f"{MIG_CONFIG_LABEL}={layout.config_name}")


def layout_from_state(state: NodeMigState) -> GpuLayout:
    gpus = []
    for gpu in state.gpus:
        counts: dict[str, int] = {}
        for profile in gpu.profiles:
            counts[profile] = counts.get(profile, 0) + 1
        gpus.append((gpu.mig_enabled, tuple(sorted(counts.items()))))
    return GpuLayout(tuple(gpus), "as the node's nvidia-smi reports it")


def advertised(hardware: GpuHardware, config: Mapping[str, Any] | None,
               node_labels: Mapping[str, str] | None, mig_state: NodeMigState | None = None) -> Advertisement:
    """Extended resources (capacity = allocatable) and GFD labels the real plugin + GFD would publish.

    With `mig_state` (a node container's nvidia-smi reading) the MIG layout and GPU count are the node's own, as the
    real plugin reads them from NVML; without it they come from the annotations and the mig.config label.
    """
    config = config or {}
    node_labels = node_labels or {}
    problems = validate_config(config)
    if problems:
        return Advertisement.failed("invalid device plugin config: " + "; ".join(problems))
    strategy = (config.get("flags") or {}).get("migStrategy") or "none"
    if mig_state is not None:
        hardware = dataclasses.replace(hardware, count=len(mig_state.gpus))
        layout = layout_from_state(mig_state)
    else:
        try:
            layout = layout_from_label(hardware, node_labels)
        except MigLayoutError as error:
            return Advertisement.failed(str(error))
    sharing_kind, sharing = _active_sharing(config)
    if sharing_kind == "mps" and layout.any_enabled:
        return Advertisement.failed(f"MPS sharing is not supported for MIG devices ({layout.source})")

    serves_mig = layout.any_enabled and strategy != "none"
    devices: dict[str, int] = {}
    mig_resources: dict[str, str] = {}  # resource -> MIG profile
    if not serves_mig:
        devices[GPU_RESOURCE] = hardware.count
    elif any(enabled and not per_gpu for enabled, per_gpu in layout.gpus):
        return Advertisement.failed("invalid MIG configuration: at least one device with migEnabled=true has no MIG "
                                    f"devices ({layout.source})")
    elif strategy == "single":
        profiles = {profile for _, per_gpu in layout.gpus for profile, _count in per_gpu}
        if not all(enabled for enabled, _ in layout.gpus):
            return Advertisement.failed("invalid MIG configuration for migStrategy=single: all devices on the node "
                                        f"must be configured with the same migEnabled value ({layout.source})")
        if len(profiles) != 1:
            return Advertisement.failed("invalid MIG configuration for migStrategy=single: more than one MIG device "
                                        f"type present on node ({layout.source})")
        devices[GPU_RESOURCE] = sum(count for _, per_gpu in layout.gpus for _profile, count in per_gpu)
        mig_resources[GPU_RESOURCE] = profiles.pop()
    else:
        whole = sum(1 for enabled, _ in layout.gpus if not enabled)
        if whole:
            devices[GPU_RESOURCE] = whole
        for _, per_gpu in layout.gpus:
            for profile, count in per_gpu:
                name = _mig_resource_name(profile)
                devices[name] = devices.get(name, 0) + count
                mig_resources[name] = profile

    resources = dict(devices)
    if sharing is not None:
        for entry in sharing["resources"]:
            name = normalise_resource_name(entry["name"])
            if name not in devices:  # the plugin skips resources this node does not have
                continue
            target = name + SHARED_SUFFIX if sharing.get("renameByDefault") else name
            del resources[name]
            resources[target] = devices[name] * entry["replicas"]

    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/mig.capable": "true" if hardware.mig_capable else "false",
        "nvidia.com/mps.capable": "true" if sharing_kind == "mps" else "false",
    }
    if strategy != "none":
        labels["nvidia.com/mig.strategy"] = strategy
    # GFD labels MIG-enabled GPUs as whole GPUs without sharing; under `single` the MIG labels then override them.
    labels.update(_resource_labels(GPU_RESOURCE, hardware.count, [hardware.product], sharing_kind, sharing,
                                   with_sharing=not layout.any_enabled))
    labels[f"{GPU_RESOURCE}.memory"] = str(hardware.memory_mib)
    known = mig_product(hardware.product)
    if known is not None:
        major, minor = known.compute_capability
        labels.update({f"{GPU_RESOURCE}.family": _arch_family(major, minor),
                       f"{GPU_RESOURCE}.compute.major": str(major), f"{GPU_RESOURCE}.compute.minor": str(minor)})
    for resource, profile in mig_resources.items():
        display = profile.replace("+", ".")
        labels.update(_resource_labels(resource, devices[resource], [hardware.product, "MIG", display],
                                       sharing_kind, sharing, with_sharing=True))
        match = _MIG_PROFILE.match(profile)
        if match:
            slices, gigabytes = int(match.group(1)), int(match.group(2))
            labels.update({f"{resource}.memory": str(gigabytes * 1024), f"{resource}.slices.gi": str(slices),
                           f"{resource}.slices.ci": str(slices)})
    return Advertisement(resources=resources, labels=labels, warnings=tuple(_ignored_field_warnings(config)))


# --- Config selection (the config-manager sidecar) ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ConfigChoice:
    """The config a node runs with: its name ("" for none), the parsed file, or why it cannot be chosen."""

    name: str
    config: dict[str, Any] | None
    error: str | None = None


def parse_configs(data: Mapping[str, str] | None) -> dict[str, dict[str, Any] | str] | None:
    """ConfigMap data -> name: parsed config file, or the parse error as text. None stays None (no ConfigMap)."""
    if data is None:
        return None
    parsed: dict[str, dict[str, Any] | str] = {}
    for name, text in data.items():
        try:
            loaded = yaml.safe_load(text or "")
        except yaml.YAMLError as error:
            parsed[name] = f"config {name}: not YAML: {error}"
            continue
        if loaded is None:
            loaded = {}
        parsed[name] = loaded if isinstance(loaded, dict) else f"config {name}: must be a mapping, got {loaded!r}"
    return parsed


def choose_config(configs: Mapping[str, dict[str, Any] | str] | None, node_labels: Mapping[str, str] | None,
                  default_name: str) -> ConfigChoice:
    """The node label names the config; unset means the default. No ConfigMap or no default key: no config."""
    if configs is None:
        return ConfigChoice("", None)
    wanted = (node_labels or {}).get(CONFIG_LABEL, "")
    if wanted:
        if wanted not in configs:
            return ConfigChoice(wanted, None, f"{CONFIG_LABEL}={wanted}: no such config in the ConfigMap "
                                              f"(has: {', '.join(sorted(configs)) or 'none'})")
        name = wanted
    elif default_name in configs:
        name = default_name
    else:
        return ConfigChoice("", None)
    parsed = configs[name]
    if isinstance(parsed, str):
        return ConfigChoice(name, None, parsed)
    return ConfigChoice(name, parsed)


# --- Placement: the plugin's DaemonSet, and DRA mode (lab/dra_driver_double.py) ---------------------------------

# The device plugin role sets its DaemonSet's node label to "false" on nodes whose GPUs the DRA driver serves, and the
# nvidia_dra_driver role labels those nodes DRA_MODE_LABEL=true. A node without the plugin label is still served:
# the lab advertises GPUs before any role has run.
DEVICE_PLUGIN_DEPLOY_LABEL = "nvidia.com/gpu.deploy.device-plugin"
DRA_MODE_LABEL = "nvidia.com/gpu.deploy.dra-driver"


def plugin_serves(node_labels: Mapping[str, str] | None) -> bool:
    """False where no device plugin pod would run (its label "false") or the DRA driver serves the GPUs: the two
    never advertise the same GPUs, even while a switch has set one label and not yet the other."""
    labels = node_labels or {}
    return labels.get(DEVICE_PLUGIN_DEPLOY_LABEL) != "false" and labels.get(DRA_MODE_LABEL) != "true"


def placed_or_withdrawn(advertisement: Advertisement, node_labels: Mapping[str, str] | None) -> Advertisement:
    """The advertisement where the plugin serves the node; elsewhere no extended resources at all (as after the
    kubelet drops a plugin that went away) and no plugin error. GFD's labels stay: GFD runs in both modes."""
    if plugin_serves(node_labels):
        return advertisement
    return Advertisement(resources={}, labels=dict(advertisement.labels) if advertisement.error is None else {})


# --- Node patches ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NodeView:
    """The parts of a Node (dict as the API returns it, or a kubernetes client V1Node) the double reads."""

    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    capacity: Mapping[str, str]
    allocatable: Mapping[str, str]

    @classmethod
    def of(cls, node: Any) -> "NodeView":
        if isinstance(node, NodeView):
            return node
        if isinstance(node, Mapping):
            metadata = node.get("metadata") or {}
            status = node.get("status") or {}
            return cls(name=metadata.get("name", ""), labels=metadata.get("labels") or {},
                       annotations=metadata.get("annotations") or {}, capacity=status.get("capacity") or {},
                       allocatable=status.get("allocatable") or {})
        metadata, status = getattr(node, "metadata", None), getattr(node, "status", None)
        return cls(name=getattr(metadata, "name", "") or "", labels=getattr(metadata, "labels", None) or {},
                   annotations=getattr(metadata, "annotations", None) or {},
                   capacity=getattr(status, "capacity", None) or {},
                   allocatable=getattr(status, "allocatable", None) or {})


def is_owned_resource(name: str) -> bool:
    """Every extended resource under nvidia.com/ is the device plugin's."""
    return name.startswith(RESOURCE_PREFIX)


def is_owned_label(key: str) -> bool:
    """GFD's labels (and nvidia.com/gpu.present); not the labels people set, such as nvidia.com/mig.config."""
    return key in OWNED_NODE_LABELS or bool(_OWNED_RESOURCE_LABEL.match(key))


def _map_patch(current: Mapping[str, str], desired: Mapping[str, str], owned: Iterable[str]) -> dict[str, str | None]:
    patch: dict[str, str | None] = {key: value for key, value in desired.items() if current.get(key) != value}
    patch.update({key: None for key in owned if key in current and key not in desired})
    return patch


def node_patch(node: Any, advertisement: Advertisement, owned_previous: Iterable[str] = ()
               ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(status patch, metadata patch) as JSON merge patches, each None when the node already matches.

    Sets every advertised resource in capacity and allocatable and removes (null) owned resources no longer
    advertised; sets GFD labels and removes stale ones; sets or clears the error annotation. cpu, memory, pods and
    other resources and labels are never touched. `owned_previous` adds resource names / label keys the caller knows
    the double wrote before; the ownership rules above find the rest on the node itself, so no state is kept.
    """
    view = NodeView.of(node)
    extra = set(owned_previous)
    annotations: dict[str, str | None] = {}
    if advertisement.error is not None:
        error = advertisement.error[:MAX_ERROR_LENGTH]
        if view.annotations.get(ERROR_ANNOTATION) != error:
            annotations[ERROR_ANNOTATION] = error
        return None, ({"metadata": {"annotations": annotations}} if annotations else None)
    if ERROR_ANNOTATION in view.annotations:
        annotations[ERROR_ANNOTATION] = None

    desired = {name: str(count) for name, count in advertisement.resources.items()}
    status: dict[str, dict[str, str | None]] = {}
    for field, current in (("capacity", view.capacity), ("allocatable", view.allocatable)):
        owned = {name for name in current if is_owned_resource(name)} | extra
        changes = _map_patch({k: str(v) for k, v in current.items()}, desired, owned)
        if changes:
            status[field] = changes
    owned_labels = {key for key in view.labels if is_owned_label(key)} | extra
    labels = _map_patch(view.labels, advertisement.labels, owned_labels)
    metadata: dict[str, Any] = {}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return ({"status": status} if status else None), ({"metadata": metadata} if metadata else None)


def describe_change(view: NodeView, status_patch: Mapping[str, Any] | None, metadata_patch: Mapping[str, Any] | None,
                    config_name: str, error: str | None) -> str:
    """One log line: "gpu-h100-0: nvidia.com/gpu 8 -> 32 (config time-sliced)"."""
    config = f"config {config_name}" if config_name else "no config"
    if error is not None:
        return f"{view.name}: device plugin would not start, node left as it is: {error}"
    parts: list[str] = []
    capacity = (status_patch or {}).get("status", {}).get("capacity", {})
    for name, new in capacity.items():
        parts.append(f"{name} {view.capacity.get(name, '-')} -> {'-' if new is None else new}")
    metadata = (metadata_patch or {}).get("metadata", {})
    if metadata.get("labels"):
        parts.append(f"{len(metadata['labels'])} GFD label(s) updated")
    if metadata.get("annotations", {}).get(ERROR_ANNOTATION, "") is None:
        parts.append("error cleared")
    if not parts:  # allocatable alone differed
        parts.append("allocatable realigned with capacity")
    return f"{view.name}: {', '.join(parts)} ({config})"


# --- I/O: one reconcile pass and the loop ----------------------------------------------------------------------


@dataclasses.dataclass
class ReconcileResult:
    listed: int = 0
    gpu_nodes: int = 0
    status_patches: int = 0
    metadata_patches: int = 0
    errors: dict[str, str] = dataclasses.field(default_factory=dict)
    changes: list[str] = dataclasses.field(default_factory=list)


def _drained(response: Any) -> Any:
    """The body of a `_preload_content=False` response, its connection handed back to the pool (left unread, every
    request would open a new TLS connection)."""
    data = getattr(response, "data", None)
    release = getattr(response, "release_conn", None)
    if callable(release):
        release()
    return data


def _node_items(response: Any) -> list[Any]:
    """Nodes from list_node: raw JSON (the fast path, no model objects), a dict, or a V1NodeList."""
    if isinstance(response, Mapping):
        return list(response.get("items") or [])
    data = _drained(response)
    if isinstance(data, (bytes, str)):
        return list(json.loads(data).get("items") or [])
    return list(getattr(response, "items", None) or [])


def _read_config_data(api: Any, namespace: str, name: str) -> dict[str, str] | None:
    from kubernetes.client.exceptions import ApiException

    try:
        config_map = api.read_namespaced_config_map(name, namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    data = config_map.get("data") if isinstance(config_map, Mapping) else getattr(config_map, "data", None)
    return dict(data or {})


@dataclasses.dataclass(frozen=True)
class _PlannedPatch:
    view: NodeView
    status: dict[str, Any] | None
    metadata: dict[str, Any] | None
    config_name: str
    advertisement: Advertisement


def _is_gpu_node(view: NodeView) -> bool:
    return view.annotations.get(KWOK_NODE_ANNOTATION) == KWOK_NODE_VALUE and any(
        key in view.annotations for key in GPU_ANNOTATIONS)


def _plan(view: NodeView, configs: Mapping[str, dict[str, Any] | str] | None, default_config_name: str,
          memo: dict[tuple[Any, ...], Advertisement],
          mig_states: Mapping[str, NodeMigState | None] | None = None) -> tuple[Advertisement, str] | None:
    """What one listed node should advertise, and under which config name; None when the double leaves it alone
    (not a simulated GPU node, or a node container that is down or whose nvidia-smi could not be read)."""
    if view.annotations.get(KWOK_NODE_ANNOTATION) != KWOK_NODE_VALUE:
        return None
    try:
        hardware = hardware_from_annotations(view.annotations)
    except ValueError as error:
        return Advertisement.failed(str(error)), ""
    if hardware is None:
        return None
    has_container = mig_states is not None and view.name in mig_states
    state = mig_states.get(view.name) if mig_states is not None else None
    if has_container and state is None:
        return None
    choice = choose_config(configs, view.labels, default_config_name)
    # Identical nodes (a pool) share one computation.
    key = (hardware, choice.name, choice.error, state if has_container else view.labels.get(MIG_CONFIG_LABEL, ""))
    if key not in memo:
        memo[key] = (Advertisement.failed(choice.error) if choice.error
                     else advertised(hardware, choice.config, view.labels, state))
    return placed_or_withdrawn(memo[key], view.labels), choice.name


def _apply(api: Any, planned: _PlannedPatch) -> str | None:
    """Send one node's patches; the error text when the API refused them."""
    try:
        if planned.status is not None:
            _drained(api.patch_node_status(planned.view.name, planned.status, _content_type=MERGE_PATCH,
                                           _preload_content=False))
        if planned.metadata is not None:
            _drained(api.patch_node(planned.view.name, planned.metadata, _content_type=MERGE_PATCH,
                                    _preload_content=False))
    except Exception as error:  # one node going away must not stop the pass over a thousand others
        return f"patch failed: {error}"
    return None


def reconcile_once(api: Any, config_namespace: str, config_map_name: str, default_config_name: str,
                   workers: int = 8, mig_states: NodeMigStates | None = None) -> ReconcileResult:
    """One pass: one LIST of nodes, one GET of the ConfigMap, then PATCHes only for nodes that differ, sent by up
    to `workers` threads (each PATCH waits on the API server and etcd; the pure work before it is done once).
    With `mig_states`, GPU nodes that have a lab node container take their MIG layout from its nvidia-smi."""
    result = ReconcileResult()
    nodes = _node_items(api.list_node(_preload_content=False))
    configs = parse_configs(_read_config_data(api, config_namespace, config_map_name))
    result.listed = len(nodes)
    views = [NodeView.of(node) for node in nodes]
    readings = mig_states.current(view.name for view in views if _is_gpu_node(view)) if mig_states else None
    memo: dict[tuple[Any, ...], Advertisement] = {}
    plans: list[_PlannedPatch] = []
    for view in views:
        planned = _plan(view, configs, default_config_name, memo, readings)
        if planned is None:
            continue
        advertisement, config_name = planned
        result.gpu_nodes += 1
        if advertisement.error is not None:
            result.errors[view.name] = advertisement.error
        status_patch, metadata_patch = node_patch(view, advertisement)
        if status_patch is not None or metadata_patch is not None:
            plans.append(_PlannedPatch(view, status_patch, metadata_patch, config_name, advertisement))
    if workers > 1 and len(plans) > 1:
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            outcomes = list(pool.map(lambda planned: _apply(api, planned), plans))
    else:
        outcomes = [_apply(api, planned) for planned in plans]
    for planned, failure in zip(plans, outcomes):
        if failure is not None:
            LOG.warning("%s: %s", planned.view.name, failure)
            result.errors[planned.view.name] = failure
            continue
        result.status_patches += planned.status is not None
        result.metadata_patches += planned.metadata is not None
        line = describe_change(planned.view, planned.status, planned.metadata, planned.config_name,
                               planned.advertisement.error)
        result.changes.append(line)
        LOG.info("%s", line)
        for warning in planned.advertisement.warnings:
            LOG.warning("%s: %s", planned.view.name, warning)
    return result


def run(kubeconfig: str | None, namespace: str = "nvidia-device-plugin",
        config_map: str = "nvidia-device-plugin-configs", default_config: str = "default", interval_s: float = 2.0,
        once: bool = False, stop: threading.Event | None = None, workers: int = 8,
        mig_refresh_s: float | None = 10.0) -> int:
    """Reconcile every `interval_s` seconds until `stop` is set (SIGTERM / SIGINT set it in main()). Returns the
    exit status: 0, or 1 when a --once pass failed."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    # One pooled connection per worker; more workers than pooled connections would reconnect (TLS) every time.
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 1, workers)
    api = client.CoreV1Api(client.ApiClient(configuration))
    stop = stop or threading.Event()
    mig_states = NodeMigStates(PodmanMigReader(), mig_refresh_s) if mig_refresh_s is not None else None
    while True:
        try:
            result = reconcile_once(api, namespace, config_map, default_config, workers, mig_states)
        except Exception as error:  # the API server may be restarting; the next pass retries
            LOG.error("reconcile pass failed: %s", error)
            if once:
                return 1
        else:
            LOG.debug("pass: %d nodes listed, %d GPU nodes, %d status + %d metadata patches", result.listed,
                      result.gpu_nodes, result.status_patches, result.metadata_patches)
        if once or stop.wait(interval_s):
            return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="device_plugin_double.py",
        description="Lab DOUBLE of the NVIDIA k8s-device-plugin (v0.17-v0.20) and GPU Feature Discovery, for the "
                    "lab only: on simulated (kwok) GPU nodes it sets the nvidia.com/* extended resources and GFD "
                    "labels the real pair would publish, following the device plugin ConfigMap, the node label "
                    f"{CONFIG_LABEL} and {MIG_CONFIG_LABEL}. Never run it against a real cluster.",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig of the lab cluster (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--namespace", default="nvidia-device-plugin", help="namespace of the device plugin ConfigMap")
    parser.add_argument("--config-map", default="nvidia-device-plugin-configs",
                        help="ConfigMap whose keys are config names and values device plugin config files")
    parser.add_argument("--default-config", default="default",
                        help=f"config for nodes without the {CONFIG_LABEL} label")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between passes (default 2)")
    parser.add_argument("--workers", type=int, default=8, help="concurrent PATCH requests in a pass (default 8)")
    parser.add_argument("--mig-refresh", type=float, default=10.0,
                        help="seconds between reads of the lab node containers' nvidia-smi MIG state (default 10)")
    parser.add_argument("--no-node-containers", action="store_true",
                        help="take every node's MIG layout from its nvidia.com/mig.config label, never from a lab "
                             "node container")
    parser.add_argument("--once", action="store_true", help="run one pass and exit")
    parser.add_argument("--verbose", action="store_true", help="also log a summary line per pass")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.interval <= 0 or args.workers < 1 or args.mig_refresh < 0:
        print("device_plugin_double.py: --interval must be > 0, --workers >= 1 and --mig-refresh >= 0",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s device-plugin-double: %(message)s")
    LOG.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        LOG.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    return run(args.kubeconfig, args.namespace, args.config_map, args.default_config, args.interval, args.once, stop,
               args.workers, None if args.no_node_containers else args.mig_refresh)


if __name__ == "__main__":
    sys.exit(main())
