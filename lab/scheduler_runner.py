#!/usr/bin/env python3
"""Lab stand-in for the kubelet that would run the project's second schedulers. For the lab only.

kwok plays the kubelets of the lab's nodes: a Deployment's pods are bound and reported Running, but no container
runs. So the GPU bin-packing scheduler the gpu_scheduling role deploys (a Deployment of kube-scheduler in kube-system)
would never schedule anything in the lab. This process runs what that pod would run, with what the role applied:

* it watches Deployments in kube-system labelled `app.kubernetes.io/component=scheduler` and
  `app.kubernetes.io/managed-by=gpu-cluster`;
* for each, it reads the ConfigMap the pod template mounts (`config.yaml`) and asks the API server for a token of the
  pod's ServiceAccount (TokenRequest), so the scheduler acts with exactly the RBAC the role granted;
* it runs the real kube-scheduler binary (the lab's, the API server's version) with that configuration. The only
  change is `clientConnection.kubeconfig`, which points at a kubeconfig holding that token, as the in-cluster
  connection would; serving is off (`--secure-port=0`): the lab does not probe it;
* a changed ConfigMap or ServiceAccount restarts it; a Deployment gone, or scaled to 0, stops it.

Its own reads use the lab identity gpu-lab:scheduler-runner (system:masters), never the admin's, so the benchmarks
that count the admin's requests in the audit log are not disturbed. Logs: <state>/logs/scheduler-<name>.log.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Optional

import yaml
from kubernetes import client, config as kube_config

SELECTOR = "app.kubernetes.io/component=scheduler,app.kubernetes.io/managed-by=gpu-cluster"
NAMESPACE = "kube-system"
TOKEN_SECONDS = 24 * 3600
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child: SIGTERM when the runner dies, so `labctl down` leaves no scheduler behind."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Runner:
    def __init__(self, kubeconfig: str, binary: str, state: Path) -> None:
        kube_config.load_kube_config(config_file=kubeconfig)
        self.api = client.ApiClient()
        self.apps = client.AppsV1Api(self.api)
        self.core = client.CoreV1Api(self.api)
        self.binary = binary
        self.state = state
        self.server = self.api.configuration.host
        self.ca_file = self.api.configuration.ssl_ca_cert
        self.running: Dict[str, tuple[str, subprocess.Popen, float]] = {}

    def wanted(self) -> Dict[str, tuple[str, str]]:
        """{deployment name: (service account, config.yaml)} of the schedulers that should run."""
        wanted = {}
        for deployment in self.apps.list_namespaced_deployment(NAMESPACE, label_selector=SELECTOR).items:
            spec = deployment.spec.template.spec
            if not deployment.spec.replicas:
                continue
            config_map = next((volume.config_map.name for volume in spec.volumes or [] if volume.config_map), None)
            if not config_map:
                continue
            try:
                data = self.core.read_namespaced_config_map(config_map, NAMESPACE).data or {}
            except client.ApiException as error:
                if error.status == 404:
                    continue
                raise
            if "config.yaml" in data:
                wanted[deployment.metadata.name] = (spec.service_account_name or "default", data["config.yaml"])
        return wanted

    def start(self, name: str, account: str, config_text: str, key: str) -> subprocess.Popen:
        directory = self.state / "schedulers" / name
        directory.mkdir(parents=True, exist_ok=True)
        token = self.core.create_namespaced_service_account_token(
            account, NAMESPACE, client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=TOKEN_SECONDS))).status.token
        kubeconfig = directory / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "in-cluster",
            "clusters": [{"name": "lab", "cluster": {"server": self.server, "certificate-authority": self.ca_file}}],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": "in-cluster", "context": {"cluster": "lab", "user": account}}]}))
        kubeconfig.chmod(0o600)
        scheduler_config = yaml.safe_load(config_text)
        scheduler_config.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
        config_file = directory / "config.yaml"
        config_file.write_text(yaml.safe_dump(scheduler_config, sort_keys=False))
        log = (self.state / "logs" / f"scheduler-{name}.log").open("a", encoding="utf-8")
        log.write(f"--- scheduler-runner: starting {name} (service account {account}, config {key[:12]})\n")
        log.flush()
        return subprocess.Popen(  # noqa: S603 (the lab's own binary)
            [self.binary, f"--config={config_file}", f"--authentication-kubeconfig={kubeconfig}",
             f"--authorization-kubeconfig={kubeconfig}", "--secure-port=0", "--v=2"],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)

    def stop(self, name: str) -> None:
        _, process, _ = self.running.pop(name)
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def sync(self) -> None:
        wanted = self.wanted()
        for name in [name for name in self.running if name not in wanted]:
            self.stop(name)
        for name, (account, config_text) in wanted.items():
            key = hashlib.sha256(f"{account}\n{config_text}".encode()).hexdigest()
            current = self.running.get(name)
            # Restarted when its configuration changed, when it exited, and before its token expires.
            if current and current[0] == key and current[1].poll() is None and time.monotonic() - current[2] < TOKEN_SECONDS / 2:
                continue
            if current:
                self.stop(name)
            self.running[name] = (key, self.start(name, account, config_text, key), time.monotonic())

    def stop_all(self) -> None:
        for name in list(self.running):
            self.stop(name)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--kube-scheduler", required=True, help="the kube-scheduler binary")
    parser.add_argument("--state", required=True, help="the lab's state directory")
    parser.add_argument("--interval", type=float, default=2.0)
    args = parser.parse_args(argv)
    runner = Runner(args.kubeconfig, args.kube_scheduler, Path(args.state))

    def terminate(signum, frame):  # noqa: ARG001
        runner.stop_all()
        sys.exit(0)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    while True:
        try:
            runner.sync()
        except Exception as error:  # noqa: BLE001 (the API server restarting in a fault test: try again)
            print(f"scheduler-runner: {error}", file=sys.stderr, flush=True)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
