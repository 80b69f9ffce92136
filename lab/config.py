"""The lab's configuration (lab/lab.yml): control-plane ports and the simulated node pools, checked before use.

Every error names the key, the bad value and what is allowed, so a wrong edit fails before anything starts.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Mapping

import yaml

from _common import LabError

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "lab" / "lab.yml"
CONFIG_ENV = "GPU_LAB_CONFIG"
# Shifts every control-plane port: a second lab beside the first (with its own GPU_LAB_STATE), as CI's second
# integration lane runs one.
PORT_OFFSET_ENV = "GPU_LAB_PORT_OFFSET"

DEFAULT_POD_CIDR = "10.244.0.0/16"
# Each 100 of port offset moves the pod network down by its own size: offset 5000 gives 10.194.0.0/16.
POD_CIDR_OFFSET_STEP = 100
PORT_NAMES = ("kube_apiserver", "etcd_client", "etcd_peer", "kube_controller_manager", "kube_scheduler", "kwok")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
MAX_NODES = 5000


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    product: str
    count: int
    memory_mib: int
    mig_capable: bool


@dataclasses.dataclass(frozen=True)
class NodePool:
    prefix: str
    count: int
    host: bool
    cpu: str
    memory: str
    gpu: GpuSpec | None

    def node_names(self) -> list[str]:
        return [f"{self.prefix}-{index}" for index in range(self.count)]


@dataclasses.dataclass(frozen=True)
class DevicePluginDouble:
    namespace: str
    config_map: str
    default_config: str


@dataclasses.dataclass(frozen=True)
class LabConfig:
    ports: Mapping[str, int]
    service_cidr: str
    cluster_name: str
    device_plugin_double: DevicePluginDouble
    pools: tuple[NodePool, ...]
    # kwok hands pod IPs out of this network; Kueue's webhook serves on its pod's IP, put on the host's loopback, so
    # two labs side by side need networks of their own (load() shifts it with the port offset).
    pod_cidr: str = DEFAULT_POD_CIDR
    # GPU_LAB_PORT_OFFSET this config was loaded with. The node containers (lab/nodes.py: fixed names, one set per
    # machine) belong to the lab at offset 0; a lab beside it must not read them (node_containers below).
    port_offset: int = 0

    @property
    def node_containers(self) -> bool:
        """Whether the GPU doubles read the node containers' GPU state: only the lab at offset 0 owns them, so a
        second lab beside it (CI's lanes 2 and 3, the bench labs) never sees the first lab's GPU faults."""
        return self.port_offset == 0

    def nodes(self) -> list[tuple[str, NodePool]]:
        return [(name, pool) for pool in self.pools for name in pool.node_names()]

    def host_nodes(self) -> list[str]:
        return [name for name, pool in self.nodes() if pool.host]

    def gpu_nodes(self) -> list[str]:
        return [name for name, pool in self.nodes() if pool.gpu is not None]

    def pool_of(self, node: str) -> NodePool | None:
        return dict(self.nodes()).get(node)

    def with_pools(self, pools: tuple[NodePool, ...]) -> LabConfig:
        return dataclasses.replace(self, pools=pools)


def _fail(key: str, value: Any, allowed: str) -> LabError:
    return LabError(f"lab config: {key}={value!r} is not valid; allowed: {allowed}")


def _mapping(data: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise _fail(key, data, "a mapping")
    return data


def _int(data: Mapping[str, Any], key: str, path: str, low: int, high: int) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(f"{path}.{key}", value, f"an integer from {low} to {high}")
    return value


def _bool(data: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise _fail(f"{path}.{key}", value, "true or false")
    return value


def _label(data: Mapping[str, Any], key: str, path: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not _DNS_LABEL.match(value) or len(value) > 50:
        raise _fail(f"{path}.{key}", value, "a DNS label (lower-case letters, digits, '-'; at most 50 characters)")
    return value


def _quantity(data: Mapping[str, Any], key: str, path: str) -> str:
    value = str(data.get(key, ""))
    if not _QUANTITY.match(value):
        raise _fail(f"{path}.{key}", data.get(key), "a Kubernetes quantity such as 32, 500m, 128Gi or 2Ti")
    return value


def parse_gpu(data: Any, path: str) -> GpuSpec | None:
    if data is None:
        return None
    data = _mapping(data, path)
    product = data.get("product")
    if not isinstance(product, str) or not product.strip():
        raise _fail(f"{path}.product", product, "the product name nvidia-smi prints, e.g. 'NVIDIA H100 80GB HBM3'")
    return GpuSpec(
        product=product,
        count=_int(data, "count", path, 1, 16),
        memory_mib=_int(data, "memory_mib", path, 1024, 1_048_576),
        mig_capable=_bool(data, "mig_capable", path, False),
    )


def parse_pool(data: Any, index: int) -> NodePool:
    path = f"node_pools[{index}]"
    data = _mapping(data, path)
    return NodePool(
        prefix=_label(data, "prefix", path),
        count=_int(data, "count", path, 0, MAX_NODES),
        host=_bool(data, "host", path, False),
        cpu=_quantity(data, "cpu", path),
        memory=_quantity(data, "memory", path),
        gpu=parse_gpu(data.get("gpu"), f"{path}.gpu"),
    )


def parse_config(data: Any) -> LabConfig:
    data = _mapping(data, "lab config")
    plane = _mapping(data.get("control_plane"), "control_plane")
    raw_ports = _mapping(plane.get("ports"), "control_plane.ports")
    ports = {name: _int(raw_ports, name, "control_plane.ports", 1024, 65535) for name in PORT_NAMES}
    unknown = sorted(set(raw_ports) - set(PORT_NAMES))
    if unknown:
        raise _fail("control_plane.ports", unknown, ", ".join(PORT_NAMES))
    if len(set(ports.values())) != len(ports):
        raise _fail("control_plane.ports", ports, "a different port for each component")
    cidr = str(plane.get("service_cidr", ""))
    try:
        ipaddress.ip_network(cidr)
    except ValueError:
        raise _fail("control_plane.service_cidr", plane.get("service_cidr"), "an IPv4 network such as 10.96.0.0/16")
    pod_cidr = str(plane.get("pod_cidr", DEFAULT_POD_CIDR))
    try:
        if ipaddress.ip_network(pod_cidr).version != 4:
            raise ValueError(pod_cidr)
    except ValueError:
        raise _fail("control_plane.pod_cidr", plane.get("pod_cidr"), "an IPv4 network such as 10.244.0.0/16")
    double = _mapping(data.get("device_plugin_double"), "device_plugin_double")
    pools_data = data.get("node_pools")
    if not isinstance(pools_data, list) or not pools_data:
        raise _fail("node_pools", pools_data, "a non-empty list of pools")
    pools = tuple(parse_pool(pool, index) for index, pool in enumerate(pools_data))
    config = LabConfig(
        ports=ports,
        service_cidr=cidr,
        cluster_name=_label(plane, "cluster_name", "control_plane"),
        device_plugin_double=DevicePluginDouble(
            namespace=_label(double, "namespace", "device_plugin_double"),
            config_map=_label(double, "config_map", "device_plugin_double"),
            default_config=_label(double, "default_config", "device_plugin_double"),
        ),
        pools=pools,
        pod_cidr=pod_cidr,
    )
    check_names(config)
    return config


def check_names(config: LabConfig) -> None:
    seen: dict[str, str] = {}
    for pool in config.pools:
        for name in pool.node_names():
            if name in seen:
                raise _fail("node_pools", name, f"unique node names (pools {seen[name]!r} and {pool.prefix!r} clash)")
            seen[name] = pool.prefix


def default_path() -> Path:
    """lab/lab.yml, or $GPU_LAB_CONFIG (a second lab beside the first needs other ports and GPU_LAB_STATE)."""
    value = os.environ.get(CONFIG_ENV, "").strip()
    return Path(value) if value else DEFAULT_CONFIG


def port_offset(environ: Mapping[str, str] | None = None) -> int:
    """$GPU_LAB_PORT_OFFSET (default 0): added to every port of the config."""
    value = (os.environ if environ is None else environ).get(PORT_OFFSET_ENV, "").strip() or "0"
    if not re.fullmatch(r"[0-9]{1,5}", value) or int(value) > 20000:
        raise LabError(f"{PORT_OFFSET_ENV}={value!r} is not valid; allowed: an integer from 0 to 20000")
    return int(value)


def load(path: Path | None = None, environ: Mapping[str, str] | None = None) -> LabConfig:
    path = default_path() if path is None else path
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise LabError(f"cannot read the lab config {path}: {exc}") from exc
    config = parse_config(data)
    offset = port_offset(environ)
    if not offset:
        return config
    ports = {name: port + offset for name, port in config.ports.items()}
    if max(ports.values()) > 65535:
        raise LabError(f"{PORT_OFFSET_ENV}={offset} moves a port of {path} past 65535: {ports}")
    return dataclasses.replace(config, ports=ports, pod_cidr=shifted_pod_cidr(config.pod_cidr, offset),
                               port_offset=offset)


def shifted_pod_cidr(cidr: str, offset: int) -> str:
    """The pod network of a lab at this port offset: moved down by its own size for every POD_CIDR_OFFSET_STEP, so
    labs whose offsets differ by 100 or more never hand out the same pod IP (Kueue binds its pod IP on loopback)."""
    network = ipaddress.ip_network(cidr)
    start = int(network.network_address) - (offset // POD_CIDR_OFFSET_STEP) * network.num_addresses
    if start < 0:
        raise LabError(f"{PORT_OFFSET_ENV}={offset} moves the pod network {cidr} below 0.0.0.0; allowed: a smaller "
                       "offset or a pod_cidr higher in the address space")
    return f"{ipaddress.ip_address(start)}/{network.prefixlen}"
