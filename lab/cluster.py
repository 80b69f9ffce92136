"""The lab's Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok,
plus the device-plugin double, run as local processes on 127.0.0.1, and the simulated nodes of lab/lab.yml.

Everything here is real Kubernetes except the hardware: the API server's admission (Pod Security, ResourceQuota,
NodeRestriction and the default set), RBAC and kube-scheduler decide; kwok plays the kubelets of simulated nodes;
lab/device_plugin_double.py plays the NVIDIA device plugin. State (certificates, etcd data, logs, pid files) lives
in $GPU_LAB_STATE (default /var/lib/gpu-lab); built binaries in the cache ($GPU_LAB_CACHE/bin).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Mapping, Sequence

import yaml

import gobuild
import nodes
import pki
from _common import LabError, Stopwatch, cache_root, format_seconds, log, run, tail, write_if_changed
from config import LabConfig, NodePool

STATE_ENV = "GPU_LAB_STATE"
DEFAULT_STATE = Path("/var/lib/gpu-lab")
ROOT = Path(__file__).resolve().parents[1]
DOUBLE_SCRIPT = ROOT / "lab" / "device_plugin_double.py"
DRA_DOUBLE_SCRIPT = ROOT / "lab" / "dra_driver_double.py"
CONTROLLER_RUNNER = ROOT / "lab" / "controller_runner.py"

LAB_ANNOTATION_PREFIX = "gpu-lab.dev/"
# A pod with this annotation stays Running on its simulated node: kwok's pod-complete stage (which finishes every Job
# pod at once) skips it. Tests set it where a pod's presence matters, e.g. a distributed job's anti-affinity.
HOLD_RUNNING_ANNOTATION = "gpu-lab.dev/hold-running"
POOL_LABEL = "gpu-lab.dev/pool"
# Nodes whose GPUs NVIDIA's DRA driver serves (set by the nvidia_dra_driver role; read by both GPU doubles).
DRA_MODE_LABEL = "nvidia.com/gpu.deploy.dra-driver"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)
NODE_PODS = "110"
# Lab process name -> the program it runs, in start order (`down` stops them in reverse).
PROGRAMS = {
    "etcd": "etcd", "kube-apiserver": "kube-apiserver", "kube-controller-manager": "kube-controller-manager",
    "kube-scheduler": "kube-scheduler", "kwok": "kwok", "device-plugin-double": "device_plugin_double.py",
    "dra-driver-double": "dra_driver_double.py", "controller-runner": "controller_runner.py",
}
START_TIMEOUT_S = 90.0
CREATE_WORKERS = 8
PORT_RELEASE_S = 10.0


def state_root(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    value = env.get(STATE_ENV, "").strip()
    return Path(value) if value else DEFAULT_STATE


@dataclasses.dataclass(frozen=True)
class Paths:
    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.pki / "admin.kubeconfig"

    @property
    def kwok_config(self) -> Path:
        return self.root / "kwok.yaml"

    @property
    def audit_policy(self) -> Path:
        return self.root / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        return self.logs / "audit.log"

    def pid_file(self, name: str) -> Path:
        return self.run / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        return self.logs / f"{name}.log"


# --------------------------------------------------------------------------------------------------------------------
# process definitions
# --------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Process:
    name: str
    argv: tuple[str, ...]
    port_key: str | None  # the lab.yml key of the port it listens on (for "port taken" errors)
    health: Callable[[], bool]


def url_ok(url: str, ca: Path | None = None) -> bool:
    """GET answers 200: http, or https verified against ca (unverified without one: kcm/scheduler self-sign)."""
    context = ssl.create_default_context(cafile=str(ca)) if ca else ssl._create_unverified_context()  # noqa: S323
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:  # noqa: S310 (loopback only)
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def http_json_ok(url: str, key: str, expected: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (loopback only)
            return str(json.loads(response.read()).get(key)).lower() == expected
    except (urllib.error.URLError, OSError, ValueError):
        return False


def apiserver_url(config: LabConfig) -> str:
    return f"https://127.0.0.1:{config.ports['kube_apiserver']}"


def processes(config: LabConfig, builds: Mapping[str, gobuild.Build], paths: Paths, python: str) -> list[Process]:
    """The control plane in start order, with the flags a production control plane would use where they matter."""
    ports = config.ports
    pki_dir = paths.pki
    etcd_url = f"http://127.0.0.1:{ports['etcd_client']}"
    peer_url = f"http://127.0.0.1:{ports['etcd_peer']}"
    kube = builds["kubernetes"]
    double = config.device_plugin_double
    # The node containers are the lab's at offset 0: a lab beside it reads its GPUs from its own config, or a GPU fault
    # injected into a node container of the first lab would show in the second (seen in CI's lane 3).
    not_node_containers = () if config.node_containers else ("--no-node-containers",)
    return [
        Process("etcd", (
            str(builds["etcd"].binary("etcd")),
            "--name=gpu-lab", f"--data-dir={paths.etcd_data}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=gpu-lab={peer_url}", "--initial-cluster-state=new",
            "--quota-backend-bytes=8589934592", "--snapshot-count=10000",
            # The lab's data is disposable (`labctl down` deletes it); without fsync the 1000-node benchmark
            # measures the control plane, not this VM's disk flushes.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ), "etcd_client", lambda: http_json_ok(f"{etcd_url}/health", "health", "true")),
        Process("kube-apiserver", (
            str(kube.binary("kube-apiserver")),
            "--advertise-address=127.0.0.1", "--bind-address=127.0.0.1", f"--secure-port={ports['kube_apiserver']}",
            # The lease reconciler refuses a loopback address for the `kubernetes` Service's endpoints; nothing in
            # the lab reaches the API server through that Service (kwok's pods run nothing).
            "--endpoint-reconciler-type=none",
            # Webhooks (Kueue's) are called at the pod IP their Service's EndpointSlice lists, not at a ClusterIP:
            # the lab has no kube-proxy; lab/controller_runner.py serves on that IP.
            "--enable-aggregator-routing=true",
            f"--etcd-servers={etcd_url}",
            f"--service-cluster-ip-range={config.service_cidr}",
            f"--tls-cert-file={pki_dir / 'apiserver.crt'}", f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
            f"--client-ca-file={pki_dir / 'ca.crt'}",
            f"--service-account-key-file={pki_dir / 'sa.pub'}",
            f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--authorization-mode=Node,RBAC",
            # Added to the default set (which already holds NamespaceLifecycle, LimitRanger, ServiceAccount,
            # PodSecurity, Priority, ResourceQuota, DefaultTolerationSeconds, the webhooks, ...), as kubeadm does.
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            "--profiling=false",
            "--event-ttl=1h",
            "--max-requests-inflight=800", "--max-mutating-requests-inflight=400",
            # What the admin (the playbooks, the tests, the benchmarks) asks of the API server, one line a request:
            # the benchmarks count a run's requests from it (bench/drift_check.py).
            f"--audit-policy-file={paths.audit_policy}", f"--audit-log-path={paths.audit_log}",
            "--audit-log-format=json", "--audit-log-maxsize=50", "--audit-log-maxbackup=1",
        ), "kube_apiserver", lambda: url_ok(f"{apiserver_url(config)}/readyz", pki_dir / "ca.crt")),
        Process("kube-controller-manager", (
            str(kube.binary("kube-controller-manager")),
            f"--kubeconfig={pki_dir / 'controller-manager.kubeconfig'}",
            f"--authentication-kubeconfig={pki_dir / 'controller-manager.kubeconfig'}",
            f"--authorization-kubeconfig={pki_dir / 'controller-manager.kubeconfig'}",
            "--bind-address=127.0.0.1", f"--secure-port={ports['kube_controller_manager']}",
            f"--cluster-name={config.cluster_name}",
            f"--root-ca-file={pki_dir / 'ca.crt'}",
            f"--service-account-private-key-file={pki_dir / 'sa.key'}",
            f"--cluster-signing-cert-file={pki_dir / 'ca.crt'}", f"--cluster-signing-key-file={pki_dir / 'ca.key'}",
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            "--kube-api-qps=200", "--kube-api-burst=400",
            "--concurrent-daemonset-syncs=4",
        ), "kube_controller_manager",
            lambda: url_ok(f"https://127.0.0.1:{ports['kube_controller_manager']}/healthz")),
        Process("kube-scheduler", (
            str(kube.binary("kube-scheduler")),
            f"--kubeconfig={pki_dir / 'scheduler.kubeconfig'}",
            f"--authentication-kubeconfig={pki_dir / 'scheduler.kubeconfig'}",
            f"--authorization-kubeconfig={pki_dir / 'scheduler.kubeconfig'}",
            "--bind-address=127.0.0.1", f"--secure-port={ports['kube_scheduler']}",
            "--leader-elect=false",
        ), "kube_scheduler", lambda: url_ok(f"https://127.0.0.1:{ports['kube_scheduler']}/healthz")),
        Process("kwok", (
            str(kube.binary("kwok")),
            f"--config={paths.kwok_config}",
            f"--kubeconfig={pki_dir / 'kwok.kubeconfig'}",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            f"--server-address=127.0.0.1:{ports['kwok']}",
            f"--cidr={config.pod_cidr}", "--node-ip=10.0.0.1",
        ), "kwok", lambda: url_ok(f"http://127.0.0.1:{ports['kwok']}/healthz")),
        Process("device-plugin-double", (
            python, str(DOUBLE_SCRIPT),
            f"--kubeconfig={pki_dir / 'device-plugin-double.kubeconfig'}",
            f"--namespace={double.namespace}", f"--config-map={double.config_map}",
            f"--default-config={double.default_config}", *not_node_containers,
        ), None, lambda: True),
        # Publishes the ResourceSlices of NVIDIA's DRA driver for the GPU nodes in DRA mode: lab/dra_driver_double.py.
        Process("dra-driver-double", (
            python, str(DRA_DOUBLE_SCRIPT), f"--kubeconfig={pki_dir / 'dra-driver-double.kubeconfig'}",
            *not_node_containers,
        ), None, lambda: True),
        # Runs the second schedulers and Kueue that the cluster roles deploy (kwok runs no container):
        # lab/controller_runner.py.
        Process("controller-runner", (
            python, str(CONTROLLER_RUNNER),
            f"--kubeconfig={pki_dir / 'controller-runner.kubeconfig'}",
            f"--kube-scheduler={kube.binary('kube-scheduler')}",
            f"--kueue={builds['kueue'].binary('kueue')}",
            f"--state={paths.root}",
        ), None, lambda: True),
    ]


# --------------------------------------------------------------------------------------------------------------------
# processes: start, find, stop
# --------------------------------------------------------------------------------------------------------------------


def read_pid(paths: Paths, name: str) -> int | None:
    try:
        return int(paths.pid_file(name).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def process_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def program_name(argv: Sequence[str]) -> str:
    """What identifies a lab process: the binary's file name, or the script's for a Python program."""
    names = [Path(part).name for part in argv[:2]]
    return names[1] if names and names[0].startswith("python") and len(names) > 1 else names[0] if names else ""


def running_pid(paths: Paths, process: Process) -> int | None:
    """The pid from the pid file when it still runs this program (pid files outlive processes, pids get reused)."""
    pid = read_pid(paths, process.name)
    if pid is not None and is_alive(pid) and program_name(process_cmdline(pid)) == program_name(process.argv):
        return pid
    return None


def port_holder(port: int) -> str:
    """Who listens on 127.0.0.1:port, as `ss` tells it (empty when free or ss is missing)."""
    try:
        result = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return ""
    return result.stdout.strip()


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def check_port(config: LabConfig, process: Process) -> None:
    if process.port_key is None:
        return
    ports = [config.ports[process.port_key]]
    if process.name == "etcd":
        ports.append(config.ports["etcd_peer"])
    for port in ports:
        deadline = time.monotonic() + PORT_RELEASE_S
        while not port_free(port) and time.monotonic() < deadline:
            time.sleep(0.2)  # a process we just stopped may still be closing its listener
        if not port_free(port):
            holder = port_holder(port) or "another program"
            raise LabError(f"cannot start {process.name}: 127.0.0.1:{port} is taken ({holder}); stop that program "
                           f"or choose another port under control_plane.ports in lab/lab.yml")


def start(paths: Paths, process: Process) -> int:
    paths.logs.mkdir(parents=True, exist_ok=True)
    paths.run.mkdir(parents=True, exist_ok=True)
    with open(paths.log_file(process.name), "a", encoding="utf-8") as log_file:
        log_file.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {process.name}\n")
        log_file.flush()
        proc = subprocess.Popen(  # noqa: S603 (our own argv)
            list(process.argv), stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=paths.root,
        )
    paths.pid_file(process.name).write_text(f"{proc.pid}\n")
    return proc.pid


def wait_healthy(paths: Paths, process: Process, pid: int, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive(pid):
            raise LabError(f"{process.name} exited during start; last lines of {paths.log_file(process.name)}:\n"
                           + tail(paths.log_file(process.name).read_text(errors="replace"), 20))
        if process.health():
            return
        time.sleep(0.25)
    raise LabError(f"{process.name} did not become healthy within {timeout:.0f} s; last lines of "
                   f"{paths.log_file(process.name)}:\n" + tail(paths.log_file(process.name).read_text(errors="replace"),
                                                                20))


def stop_pid(pid: int, name: str, timeout: float = 15.0) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return
        time.sleep(0.1)
    log(f"{name} ignored SIGTERM for {timeout:.0f} s; killing it")
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# --------------------------------------------------------------------------------------------------------------------
# kwok configuration and the simulated nodes
# --------------------------------------------------------------------------------------------------------------------


def kwok_config(stage_dir: Path) -> str:
    """kwok's configuration: its options plus kwok's own upstream stages for nodes and pods (from the pinned module).

    One change to upstream: pod-complete skips pods annotated HOLD_RUNNING_ANNOTATION, so they stay Running.
    """
    options = {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
               # Set explicitly: a config file's options are not defaulted the way kwok's flags are (a zero
               # lease parallelism stops kwok at start). 16 workers keep a thousand nodes' leases fresh.
               "options": {"nodeLeaseDurationSeconds": 40, "nodeLeaseParallelism": 16,
                           "nodePlayStageParallelism": 16, "podPlayStageParallelism": 16,
                           "podsOnNodeSyncParallelism": 4, "enableCRDs": []}}
    documents = [yaml.safe_dump(options, sort_keys=False)]
    for relative in KWOK_STAGES:
        path = stage_dir / relative
        if not path.is_file():
            raise LabError(f"kwok stage {relative} not found under {stage_dir}; is the kwok version in lab/go/kubernetes/go.mod right?")
        stage = yaml.safe_load(path.read_text())
        if stage.get("metadata", {}).get("name") == "pod-complete":
            hold = {"key": f'.metadata.annotations["{HOLD_RUNNING_ANNOTATION}"]', "operator": "DoesNotExist"}
            stage.setdefault("spec", {}).setdefault("selector", {}).setdefault("matchExpressions", []).append(hold)
        documents.append(yaml.safe_dump(stage, sort_keys=False))
    return "---\n".join(documents)


def node_manifest(name: str, pool: NodePool) -> dict:
    """A simulated node as a kubelet would register it: no GPU resources (the device-plugin double adds them)."""
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": pool.prefix, POOL_LABEL: pool.prefix, "type": "kwok",
    }
    annotations = {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"}
    if pool.gpu is not None:
        annotations.update({
            "gpu-lab.dev/gpu-product": pool.gpu.product,
            "gpu-lab.dev/gpu-count": str(pool.gpu.count),
            "gpu-lab.dev/gpu-memory-mib": str(pool.gpu.memory_mib),
            "gpu-lab.dev/mig-capable": "true" if pool.gpu.mig_capable else "false",
        })
    resources = {"cpu": pool.cpu, "memory": pool.memory, "pods": NODE_PODS}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {},
        "status": {
            "capacity": dict(resources), "allocatable": dict(resources),
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "kwok",
                         "kubeProxyVersion": "kwok", "containerRuntimeVersion": "kwok", "osImage": "gpu-lab (kwok)",
                         "kernelVersion": "", "machineID": "", "systemUUID": "", "bootID": ""},
        },
    }


def node_plan(config: LabConfig, existing: Mapping[str, Mapping[str, str]]) -> tuple[list[str], list[str]]:
    """Nodes to create and lab nodes to delete; `existing` maps node names to their labels.

    Only nodes the lab created (label gpu-lab.dev/pool) are ever deleted: a node someone else registered stays.
    """
    wanted = {name for name, _pool in config.nodes()}
    create = [name for name, _pool in config.nodes() if name not in existing]
    delete = sorted(name for name, labels in existing.items() if POOL_LABEL in labels and name not in wanted)
    return create, delete


# --------------------------------------------------------------------------------------------------------------------
# the commands
# --------------------------------------------------------------------------------------------------------------------


def kube_client(kubeconfig: Path):  # noqa: ANN201 (kubernetes is imported lazily)
    from kubernetes import client, config as kube_config

    api_client = kube_config.new_client_from_config(config_file=str(kubeconfig))
    return client.CoreV1Api(api_client)


def ensure_nodes(core, config: LabConfig) -> tuple[int, int]:  # noqa: ANN001
    from kubernetes.client.exceptions import ApiException

    existing = {node.metadata.name: node.metadata.labels or {} for node in core.list_node().items}
    create, delete = node_plan(config, existing)
    pools = dict(config.nodes())

    def create_one(name: str) -> None:
        try:
            core.create_node(node_manifest(name, pools[name]))
        except ApiException as exc:
            if exc.status != 409:
                raise LabError(f"creating node {name} failed: {exc.status} {exc.reason}: {exc.body}") from exc

    # Parallel POSTs: a thousand nodes register in seconds, as a real fleet's kubelets would.
    with concurrent.futures.ThreadPoolExecutor(max_workers=CREATE_WORKERS) as pool:
        list(pool.map(create_one, create))
    for name in delete:
        core.delete_node(name)
    return len(create), len(delete)


def node_ready(node) -> bool:  # noqa: ANN001
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))


def gpu_advertised(node) -> bool:  # noqa: ANN001
    """True once the device-plugin double has put some nvidia.com/ resource on a GPU node (or the node is in DRA
    mode: the DRA-driver double publishes its GPUs as a ResourceSlice instead)."""
    annotations = node.metadata.annotations or {}
    if "gpu-lab.dev/gpu-count" not in annotations:
        return True
    if (node.metadata.labels or {}).get(DRA_MODE_LABEL) == "true":
        return True
    allocatable = node.status.allocatable or {}
    return any(key.startswith("nvidia.com/") for key in allocatable) or \
        "gpu-lab.dev/device-plugin-double-error" in annotations


def wait_nodes(core, config: LabConfig, timeout: float) -> float:  # noqa: ANN001
    """Wait until every lab node is Ready and advertises its GPUs; return the seconds it took."""
    timer = Stopwatch()
    wanted = {name for name, _pool in config.nodes()}
    pending: list[str] = sorted(wanted)
    last_report = 0.0
    while timer.elapsed < timeout:
        nodes = {node.metadata.name: node for node in core.list_node(label_selector=POOL_LABEL).items}
        pending = sorted(name for name in wanted
                         if name not in nodes or not (node_ready(nodes[name]) and gpu_advertised(nodes[name])))
        if not pending:
            return timer.elapsed
        if timer.elapsed - last_report > 15:
            log(f"waiting for {len(pending)} of {len(wanted)} nodes to be Ready with GPUs advertised "
                f"({format_seconds(timer.elapsed)})")
            last_report = timer.elapsed
        time.sleep(max(0.5, len(wanted) / 1000))  # one LIST of a thousand nodes a second is plenty
    raise LabError(f"{len(pending)} nodes not Ready with GPUs advertised after {timeout:.0f} s: "
                   f"{', '.join(pending[:10])}{' ...' if len(pending) > 10 else ''}; see the kwok and "
                   "device-plugin-double logs under the lab state directory")


KWOK_MODULE = "sigs.k8s.io/kwok"


def kwok_stage_dir() -> Path:
    build = gobuild.COMPONENTS["kubernetes"]
    go_mod = (build.source_dir / "go.mod").read_text()
    version = gobuild.pinned_version(go_mod, KWOK_MODULE)
    return cache_root() / "go" / "mod" / "sigs.k8s.io" / f"kwok@{version}" / "kustomize" / "stage"


def ensure_kwok_stages(paths: Paths) -> None:
    stage_dir = kwok_stage_dir()
    if not stage_dir.is_dir():
        build = gobuild.COMPONENTS["kubernetes"]
        run([gobuild.go_binary(), "mod", "download", KWOK_MODULE], env=gobuild.go_env(cache_root()),
            cwd=build.source_dir)
    write_if_changed(paths.kwok_config, kwok_config(stage_dir))


# Only the admin identity's requests (not the kubelets', controllers' or kwok's heartbeats), at Metadata level: who,
# which verb on which object, and the answer's code; never a request or response body.
ADMIN_USER = next(identity.common_name for identity in pki.CLIENT_IDENTITIES if identity.file_stem == "admin")
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "users": [ADMIN_USER]}, {"level": "None"}],
}


def ensure_audit_policy(paths: Paths) -> None:
    paths.logs.mkdir(parents=True, exist_ok=True)
    write_if_changed(paths.audit_policy, yaml.safe_dump(AUDIT_POLICY, sort_keys=False))


def venv_python() -> str:
    """The interpreter of this environment under one stable name (python vs python3 would look like a new flag)."""
    return str(Path(sys.prefix) / "bin" / "python")


def control_plane_up(config: LabConfig, *, python: str | None = None, build: bool = True,
                     wait_timeout: float = 300.0) -> Paths:
    """Build (or reuse) the binaries, start what is not running, create the lab's nodes; idempotent."""
    paths = Paths(state_root())
    builds = gobuild.ensure_builds() if build else gobuild.cached_builds()
    pki.ensure_pki(paths.pki, cluster=config.cluster_name, server=apiserver_url(config),
                   service_cidr=config.service_cidr)
    ensure_kwok_stages(paths)
    ensure_audit_policy(paths)
    if config.node_containers and shutil.which("podman"):
        # Before the device-plugin double reads them: a dead node container would keep its node from ever
        # advertising GPUs, and the wait below would fail (nodes.up creates it again).
        nodes.remove_dead_containers()
    for process in processes(config, builds, paths, python or venv_python()):
        pid = running_pid(paths, process)
        if pid is not None:
            if process_cmdline(pid) == list(process.argv) and process.health():
                continue
            why = "is not healthy" if process_cmdline(pid) == list(process.argv) else "runs another build or flags"
            log(f"{process.name} (pid {pid}) {why}; restarting it")
            stop_pid(pid, process.name)
        check_port(config, process)
        timer = Stopwatch()
        pid = start(paths, process)
        wait_healthy(paths, process, pid)
        log(f"{process.name} started (pid {pid}) in {format_seconds(timer.elapsed)}")
    core = kube_client(paths.admin_kubeconfig)
    created, deleted = ensure_nodes(core, config)
    if created or deleted:
        log(f"simulated nodes: {created} created, {deleted} removed")
    waited = wait_nodes(core, config, wait_timeout)
    log(f"{len(config.nodes())} simulated nodes Ready with GPUs advertised ({format_seconds(waited)})")
    return paths


def start_fresh(config: LabConfig, *, build: bool = True) -> Paths:
    """Start a lab that is not running from empty cluster data, as a test session must: a run killed half way (a
    session's end, a reboot) leaves its processes gone and its data behind, and the objects and Events in that data
    (a tenant's Deployment, a test's ConfigMap) would change what the next run's tests see."""
    stopped = control_plane_down(config)
    log(f"cluster data of an earlier run deleted{' (stopped: ' + ', '.join(stopped) + ')' if stopped else ''}")
    return control_plane_up(config, build=build)


def control_plane_down(config: LabConfig, *, keep_data: bool = False) -> list[str]:
    """Stop every lab process (last started first) and, unless keep_data, delete the cluster's data."""
    paths = Paths(state_root())
    stopped = []
    for name, program in reversed(PROGRAMS.items()):
        pid = read_pid(paths, name)
        if pid is not None and is_alive(pid) and program_name(process_cmdline(pid)) == program:
            stop_pid(pid, name)
            stopped.append(name)
        paths.pid_file(name).unlink(missing_ok=True)
    if not keep_data:
        shutil.rmtree(paths.etcd_data, ignore_errors=True)
        paths.kwok_config.unlink(missing_ok=True)
    return stopped


@dataclasses.dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    healthy: bool
    endpoint: str


def control_plane_status(config: LabConfig) -> list[ComponentStatus]:
    paths = Paths(state_root())
    try:
        builds = gobuild.cached_builds()
    except LabError:
        builds = None
    result = []
    ports = config.ports
    endpoints = {
        "etcd": f"http://127.0.0.1:{ports['etcd_client']}", "kube-apiserver": apiserver_url(config),
        "kube-controller-manager": f"https://127.0.0.1:{ports['kube_controller_manager']}",
        "kube-scheduler": f"https://127.0.0.1:{ports['kube_scheduler']}",
        "kwok": f"http://127.0.0.1:{ports['kwok']}", "device-plugin-double": "-", "dra-driver-double": "-",
        "controller-runner": "-",
    }
    if builds is None:
        return [ComponentStatus(name, None, False, endpoint) for name, endpoint in endpoints.items()]
    for process in processes(config, builds, paths, venv_python()):
        pid = running_pid(paths, process)
        result.append(ComponentStatus(process.name, pid, pid is not None and process.health(),
                                      endpoints[process.name]))
    return result


def is_healthy(config: LabConfig) -> bool:
    return all(component.healthy for component in control_plane_status(config))


def node_rows(core) -> list[dict[str, str]]:  # noqa: ANN001
    """One row per node: name, pool, Ready, GPU product and every nvidia.com/ resource it advertises."""
    rows = []
    for node in core.list_node().items:
        labels = node.metadata.labels or {}
        annotations = node.metadata.annotations or {}
        gpus = {key: value for key, value in (node.status.allocatable or {}).items() if key.startswith("nvidia.com/")}
        rows.append({
            "name": node.metadata.name, "pool": labels.get(POOL_LABEL, "-"),
            "ready": "Ready" if node_ready(node) else "NotReady",
            "product": annotations.get("gpu-lab.dev/gpu-product", "-"),
            "gpus": ", ".join(f"{key}={value}" for key, value in sorted(gpus.items())) or "-",
        })
    return rows


def format_table(rows: Sequence[Mapping[str, str]], columns: Sequence[tuple[str, str]]) -> str:
    widths = {key: max([len(title)] + [len(str(row.get(key, ""))) for row in rows]) for key, title in columns}
    lines = ["  ".join(title.ljust(widths[key]) for key, title in columns)]
    lines += ["  ".join(str(row.get(key, "")).ljust(widths[key]) for key, _ in columns) for row in rows]
    return "\n".join(line.rstrip() for line in lines)
