#!/usr/bin/env python3
"""Lab stand-in for the kubelet that would run the project's own controllers. For the lab only.

kwok plays the kubelets of the lab's nodes: a Deployment's pods are bound and reported Running, but no container
runs. So what the cluster roles deploy as Deployments would never act in the lab. This process runs what those pods
would run, with what the roles applied, for two kinds:

* schedulers: Deployments in kube-system labelled `app.kubernetes.io/component=scheduler` and
  `app.kubernetes.io/managed-by=gpu-cluster` (the gpu_scheduling role's bin-packing scheduler). It reads the
  ConfigMap the pod template mounts (`config.yaml`) and runs the lab's real kube-scheduler binary with it; the only
  change is `clientConnection.kubeconfig`; serving is off (`--secure-port=0`): the lab does not probe it;
* Kueue: Deployments in any namespace labelled `app.kubernetes.io/name=kueue` and
  `app.kubernetes.io/managed-by=gpu-cluster` (the gpu_queues role). It reads the ConfigMap the pod template mounts
  (`controller_manager_config.yaml`) and runs the Kueue controller manager built from source (lab/go/kueue). Its
  webhooks must be reachable by the API server, as in a real cluster: the API server (`--enable-aggregator-routing`)
  sends admission and conversion requests to the pod IP that the webhook Service's EndpointSlice lists, so this
  process puts kwok's pod IP on the loopback interface (`ip addr replace <ip>/32 dev lo`, removed at stop) and Kueue
  serves its webhooks, health and readiness on that IP. Metrics serving is off. Kueue's own certificate management
  writes the webhook Secret and the CA bundles, as upstream; this process copies the Secret's keys into the
  certificate directory on every pass, as the kubelet refreshes a mounted Secret.

For both, the process acts as the pod's ServiceAccount (a TokenRequest), so the controller has exactly the RBAC the
role granted. A changed ConfigMap, ServiceAccount or pod IP restarts it; a Deployment gone, or scaled to 0, stops it.

Its own reads use the lab identity gpu-lab:controller-runner (system:masters), never the admin's, so the benchmarks
that count the admin's requests in the audit log are not disturbed. Logs: <state>/logs/<kind>-<name>.log.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import dataclasses
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Optional

import yaml
from kubernetes import client, config as kube_config

MANAGED = "app.kubernetes.io/managed-by=gpu-cluster"
SCHEDULER_SELECTOR = f"app.kubernetes.io/component=scheduler,{MANAGED}"
KUEUE_SELECTOR = f"app.kubernetes.io/name=kueue,{MANAGED}"
SCHEDULER_NAMESPACE = "kube-system"
SCHEDULER_CONFIG_KEY = "config.yaml"
KUEUE_CONFIG_KEY = "controller_manager_config.yaml"
KUEUE_CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"  # noqa: S108 (the path inside Kueue's pod, not here)
TOKEN_SECONDS = 24 * 3600
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child: SIGTERM when the runner dies, so `labctl down` leaves no controller behind."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclasses.dataclass(frozen=True)
class Wanted:
    kind: str  # scheduler | kueue
    namespace: str
    name: str
    account: str
    config_text: str
    pod_ip: str = ""
    cert_secret: str = ""  # the Secret the pod mounts as its webhook certificate directory

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.account}\n{self.pod_ip}\n{self.config_text}".encode()).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.kind}-{self.namespace}-{self.name}"


def kueue_config(text: str, pod_ip: str, cert_dir: Path, namespace: str) -> dict:
    """Kueue's configuration as the role applied it, serving on the pod's IP instead of every address of the host;
    the leader election lease in the pod's namespace (which in a pod comes from the mounted ServiceAccount)."""
    config = yaml.safe_load(text) or {}
    config.setdefault("leaderElection", {}).setdefault("resourceNamespace", namespace)
    health = config.setdefault("health", {})
    port = str(health.get("healthProbeBindAddress") or ":8081").rpartition(":")[2]
    health["healthProbeBindAddress"] = f"{pod_ip}:{port}"
    config.setdefault("metrics", {})["bindAddress"] = "0"
    webhook = config.setdefault("webhook", {})
    webhook["host"] = pod_ip
    webhook["certDir"] = str(cert_dir)
    return config


class Runner:
    def __init__(self, kubeconfig: str, scheduler: str, kueue: str, state: Path) -> None:
        kube_config.load_kube_config(config_file=kubeconfig)
        self.api = client.ApiClient()
        self.apps = client.AppsV1Api(self.api)
        self.core = client.CoreV1Api(self.api)
        self.binaries = {"scheduler": scheduler, "kueue": kueue}
        self.state = state
        self.server = self.api.configuration.host
        self.ca_file = self.api.configuration.ssl_ca_cert
        self.running: Dict[str, tuple[Wanted, subprocess.Popen, float]] = {}

    def mounted_config(self, deployment, key: str) -> Optional[str]:
        spec = deployment.spec.template.spec
        for volume in spec.volumes or []:
            if not volume.config_map:
                continue
            try:
                data = self.core.read_namespaced_config_map(volume.config_map.name, deployment.metadata.namespace).data or {}
            except client.ApiException as error:
                if error.status == 404:
                    continue
                raise
            if key in data:
                return data[key]
        return None

    def pod_ip(self, deployment) -> str:
        """The IP kwok gave the Deployment's running pod; empty while there is none."""
        labels = (deployment.spec.selector.match_labels or {}) if deployment.spec.selector else {}
        selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
        pods = self.core.list_namespaced_pod(deployment.metadata.namespace, label_selector=selector).items
        running = sorted((pod.metadata.name, pod.status.pod_ip) for pod in pods
                         if pod.status.phase == "Running" and pod.status.pod_ip and not pod.metadata.deletion_timestamp)
        return running[0][1] if running else ""

    @staticmethod
    def cert_secret(deployment) -> str:
        """The Secret mounted at Kueue's webhook certificate directory."""
        spec = deployment.spec.template.spec
        mounts = {mount.name for container in spec.containers for mount in container.volume_mounts or []
                  if mount.mount_path == KUEUE_CERT_DIR}
        return next((volume.secret.secret_name for volume in spec.volumes or [] if volume.name in mounts and volume.secret), "")

    def secret_exists(self, name: str, namespace: str) -> bool:
        try:
            self.core.read_namespaced_secret(name, namespace)
        except client.ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def sync_secret(self, item: Wanted) -> None:
        """Write the webhook Secret's keys into the certificate directory, as the kubelet's Secret volume would."""
        if not item.cert_secret:
            return
        directory = self.state / "controllers" / item.label / "certs"
        directory.mkdir(parents=True, exist_ok=True)
        try:
            data = self.core.read_namespaced_secret(item.cert_secret, item.namespace).data or {}
        except client.ApiException as error:
            if error.status == 404:
                return
            raise
        for key, value in data.items():
            content = base64.b64decode(value)
            path = directory / key
            if not path.exists() or path.read_bytes() != content:
                path.write_bytes(content)
                path.chmod(0o600)

    def wanted(self) -> Dict[str, Wanted]:
        wanted: Dict[str, Wanted] = {}
        for deployment in self.apps.list_namespaced_deployment(SCHEDULER_NAMESPACE, label_selector=SCHEDULER_SELECTOR).items:
            text = self.mounted_config(deployment, SCHEDULER_CONFIG_KEY) if deployment.spec.replicas else None
            if text is not None:
                item = Wanted("scheduler", SCHEDULER_NAMESPACE, deployment.metadata.name,
                              deployment.spec.template.spec.service_account_name or "default", text)
                wanted[item.label] = item
        for deployment in self.apps.list_deployment_for_all_namespaces(label_selector=KUEUE_SELECTOR).items:
            text = self.mounted_config(deployment, KUEUE_CONFIG_KEY) if deployment.spec.replicas else None
            pod_ip = self.pod_ip(deployment) if text is not None else ""
            secret = self.cert_secret(deployment)
            # As a kubelet: a pod whose Secret volume does not exist yet does not start.
            if pod_ip and (not secret or self.secret_exists(secret, deployment.metadata.namespace)):
                item = Wanted("kueue", deployment.metadata.namespace, deployment.metadata.name,
                              deployment.spec.template.spec.service_account_name or "default", text, pod_ip, secret)
                wanted[item.label] = item
        return wanted

    def kubeconfig(self, item: Wanted, directory: Path) -> Path:
        token = self.core.create_namespaced_service_account_token(
            item.account, item.namespace, client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=TOKEN_SECONDS))).status.token
        path = directory / "kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "in-cluster",
            "clusters": [{"name": "lab", "cluster": {"server": self.server, "certificate-authority": self.ca_file}}],
            "users": [{"name": item.account, "user": {"token": token}}],
            "contexts": [{"name": "in-cluster", "context": {"cluster": "lab", "user": item.account, "namespace": item.namespace}}]}))
        path.chmod(0o600)
        return path

    def start(self, item: Wanted) -> subprocess.Popen:
        directory = self.state / "controllers" / item.label
        directory.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.kubeconfig(item, directory)
        config_file = directory / "config.yaml"
        env = dict(os.environ)
        if item.kind == "scheduler":
            config = yaml.safe_load(item.config_text)
            config.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
            argv = [self.binaries["scheduler"], f"--config={config_file}", f"--authentication-kubeconfig={kubeconfig}",
                    f"--authorization-kubeconfig={kubeconfig}", "--secure-port=0", "--v=2"]
        else:
            config = kueue_config(item.config_text, item.pod_ip, directory / "certs", item.namespace)
            subprocess.run(["ip", "addr", "replace", f"{item.pod_ip}/32", "dev", "lo"], check=True)  # noqa: S603,S607
            env["KUEUE_KUBECONFIG"] = env["KUBECONFIG"] = str(kubeconfig)
            argv = [self.binaries["kueue"], f"--config={config_file}", "--zap-log-level=2"]
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        log = (self.state / "logs" / f"{item.kind}-{item.name}.log").open("a", encoding="utf-8")
        log.write(f"--- controller-runner: starting {item.kind} {item.namespace}/{item.name} (service account "
                  f"{item.account}, pod IP {item.pod_ip or '-'}, config {item.key[:12]})\n")
        log.flush()
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,  # noqa: S603 (the lab's own binaries)
                                preexec_fn=die_with_parent)

    def stop(self, label: str) -> None:
        item, process, _ = self.running.pop(label)
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if item.pod_ip and not any(other.pod_ip == item.pod_ip for other, _, _ in self.running.values()):
            subprocess.run(["ip", "addr", "del", f"{item.pod_ip}/32", "dev", "lo"], check=False,  # noqa: S603,S607
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def sync(self) -> None:
        wanted = self.wanted()
        for label in [label for label in self.running if label not in wanted]:
            self.stop(label)
        for label, item in wanted.items():
            current = self.running.get(label)
            # Restarted when its configuration, account or pod IP changed, when it exited, and before its token expires.
            if current and current[0].key == item.key and current[1].poll() is None and time.monotonic() - current[2] < TOKEN_SECONDS / 2:
                continue
            if current:
                self.stop(label)
            self.running[label] = (item, self.start(item), time.monotonic())
        for item, process, _ in self.running.values():
            if item.kind == "kueue" and process.poll() is None:
                self.sync_secret(item)

    def stop_all(self) -> None:
        for label in list(self.running):
            self.stop(label)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--kube-scheduler", required=True, help="the kube-scheduler binary")
    parser.add_argument("--kueue", required=True, help="the Kueue controller manager binary")
    parser.add_argument("--state", required=True, help="the lab's state directory")
    parser.add_argument("--interval", type=float, default=2.0)
    args = parser.parse_args(argv)
    runner = Runner(args.kubeconfig, args.kube_scheduler, args.kueue, Path(args.state))

    def terminate(signum, frame):  # noqa: ARG001
        runner.stop_all()
        sys.exit(0)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    while True:
        try:
            runner.sync()
        except Exception as error:  # noqa: BLE001 (the API server restarting in a fault test: try again)
            print(f"controller-runner: {error}", file=sys.stderr, flush=True)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
