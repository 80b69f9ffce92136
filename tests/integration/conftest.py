"""Integration fixtures: the lab's real control plane, started once per test session.

A healthy running lab (from `make lab` or `labctl up`) is reused and left running; one this session had to start is
stopped again at the end (set GPU_LAB_KEEP=1 to keep it). Every test works in namespaces it creates, labelled
gpu-lab.dev/test, which are deleted (and waited for) afterwards, so tests never see each other's pods.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lab"))
sys.path.insert(0, str(ROOT / "tests"))

import ci_times  # noqa: E402
import cluster  # noqa: E402
import config as lab_config  # noqa: E402

TEST_LABEL = "gpu-lab.dev/test"


class Lab:
    """What a test needs of the running lab: its config, kubeconfig and API clients."""

    def __init__(self, config: lab_config.LabConfig, started_here: bool) -> None:
        from kubernetes import client, config as kube_config

        self.config = config
        self.started_here = started_here
        self.paths = cluster.Paths(cluster.state_root())
        self.kubeconfig = self.paths.admin_kubeconfig
        self.api_client = kube_config.new_client_from_config(config_file=str(self.kubeconfig))
        self.core = client.CoreV1Api(self.api_client)
        self.apps = client.AppsV1Api(self.api_client)
        self.batch = client.BatchV1Api(self.api_client)


def playbook_env() -> dict[str, str]:
    """The environment of an ansible-playbook run from the checkout: its ansible.cfg, its virtualenv, no colours."""
    return {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
            "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}


def run_playbook(lab: "Lab", playbook: str, *args: str) -> tuple[int, str]:
    """ansible-playbook against the lab (its kubeconfig as the inventory's gpu_cluster_kubeconfig); (rc, output)."""
    import subprocess

    result = subprocess.run(
        ["ansible-playbook", f"playbooks/{playbook}", "-e", f"gpu_cluster_kubeconfig={lab.kubeconfig}", *args],
        cwd=ROOT, env=playbook_env(), capture_output=True, text=True, check=False, timeout=600)
    return result.returncode, result.stdout + result.stderr


def consumer_inventory(lab: "Lab", python: str) -> dict:
    """The lab's inventory as a user of the installed collection writes it: the GPU nodes with what they promise, the
    control host (with `python` as its interpreter) and the device plugin's sharing configs; nothing that reaches the
    node containers (a consumer's run here is the cluster side only)."""
    import yaml

    lab_inventory = yaml.safe_load((ROOT / "inventories" / "lab" / "hosts.yml").read_text(encoding="utf-8"))
    gpu_hosts = lab_inventory["all"]["children"]["gpu_nodes"]["hosts"]
    cluster_vars: dict = {"gpu_cluster_kubeconfig": str(lab.kubeconfig)}
    for path in sorted((ROOT / "inventories" / "lab" / "group_vars" / "cluster_control").glob("*.yml")):
        if path.name != "tenancy.yml":
            cluster_vars.update(yaml.safe_load(path.read_text(encoding="utf-8")) or {})
    return {"all": {"children": {
        "gpu_nodes": {"hosts": gpu_hosts},
        "cluster_control": {"hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": python}},
                            "vars": cluster_vars}}}}


def recap_changed(output: str, host: str = "localhost") -> int:
    """changed=N of a host in the PLAY RECAP."""
    import re

    match = re.search(rf"^{re.escape(host)}\s+: ok=\d+\s+changed=(\d+)", output, re.MULTILINE)
    assert match, output[-2000:]
    return int(match.group(1))


def wait_for(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.25) -> object:
    """Poll until condition() is truthy; fail naming what was awaited. Not a timing assertion: generous limits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def delete_test_namespaces(lab: Lab, names: list[str] | None = None, timeout: float = 120.0) -> None:
    from kubernetes.client.exceptions import ApiException

    if names is None:
        names = [ns.metadata.name for ns in lab.core.list_namespace(label_selector=TEST_LABEL).items]
    for name in names:
        try:
            lab.core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def gone() -> bool:
        left = {ns.metadata.name for ns in lab.core.list_namespace(label_selector=TEST_LABEL).items}
        return not left.intersection(names)

    wait_for(gone, timeout, f"test namespaces {names} to be deleted")


# Run last, in this order: the main job (it provisions the whole lab as `make lab` does), then the lifecycle test
# (it restarts the control plane and wipes its data).
RUN_LAST = ("test_main_job.py", "test_lifecycle.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: RUN_LAST.index(item.path.name) + 1 if item.path.name in RUN_LAST else 0)


# CI is CPU-bound on two cores (docs/testing.md, "Lanes and budget"): what each file costs in CPU, not only in wall
# time, says where a cut pays. Each test's setup, call and teardown are charged to its file (a session fixture's setup
# to the first file); the lab's daemons and the containers' own processes are not in it.
CPU_BY_FILE: dict[str, float] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    start = ci_times.process_cpu()
    yield
    CPU_BY_FILE[item.location[0]] = CPU_BY_FILE.get(item.location[0], 0.0) + ci_times.process_cpu() - start


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001
    if CPU_BY_FILE:
        terminalreporter.section("CPU seconds per file (pytest and the commands it waited for)")
        for line in ci_times.cpu_by_file_lines(CPU_BY_FILE):
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("the lab control plane runs as root (it keeps its state in /var/lib/gpu-lab)")
    config = lab_config.load()
    started_here = not cluster.is_healthy(config)
    if started_here:
        cluster.start_fresh(config)  # never on what a killed earlier run left in etcd
    else:
        cluster.control_plane_up(config, build=False)  # cheap when healthy: makes sure every lab node is there
    handle = Lab(config, started_here)
    delete_test_namespaces(handle)  # what an interrupted earlier session left
    yield handle
    delete_test_namespaces(handle)
    if started_here and not os.environ.get("GPU_LAB_KEEP"):
        cluster.control_plane_down(config)


@pytest.fixture
def namespace(lab: Lab) -> Iterator[Callable[..., str]]:
    """A factory of fresh namespaces (extra labels allowed), all deleted after the test."""
    created: list[str] = []

    def make(labels: dict[str, str] | None = None) -> str:
        name = f"it-{uuid.uuid4().hex[:8]}"
        lab.core.create_namespace({"metadata": {"name": name, "labels": {TEST_LABEL: "true", **(labels or {})}}})
        created.append(name)
        wait_for(lambda: _default_service_account(lab, name), 30, f"the default ServiceAccount in {name}")
        return name

    yield make
    if created:
        delete_test_namespaces(lab, created)


def _default_service_account(lab: Lab, namespace: str) -> bool:
    return any(sa.metadata.name == "default" for sa in lab.core.list_namespaced_service_account(namespace).items)


def add_gpu_nodes(lab: Lab, prefix: str, names: list[str], label: str, taint: dict,
                  extra_labels: dict[str, str] | None = None, cpu: str = "64", memory: str = "512Gi") -> None:
    """Simulated 8-GPU H100 nodes that carry `label`=true and the taint, so only a test that tolerates it uses them;
    returns once they are Ready with their GPUs advertised (the device-plugin double). Remove with remove_nodes."""
    import config as lab_config

    pool = lab_config.NodePool(prefix, len(names), False, cpu, memory,
                               lab_config.GpuSpec("NVIDIA H100 80GB HBM3", 8, 81559, True))
    for name in names:
        manifest = cluster.node_manifest(name, pool)
        manifest["metadata"]["labels"].update({label: "true", **(extra_labels or {})})
        manifest["spec"]["taints"] = [taint]
        lab.core.create_node(manifest)

    def ready() -> bool:
        nodes = [lab.core.read_node(name) for name in names]
        return all((n.status.allocatable or {}).get("nvidia.com/gpu") == "8" and any(
            c.type == "Ready" and c.status == "True" for c in n.status.conditions or []) for n in nodes)

    wait_for(ready, 120, f"nodes {names} Ready with 8 GPUs advertised")


def remove_nodes(lab: Lab, names: list[str]) -> None:
    for name in names:
        lab.core.delete_node(name)


def remove_binpack_scheduler(lab: Lab) -> None:
    """What the gpu_scheduling role applied for gpu-binpack (the role leaves it when turned off): so no second
    scheduler runs on into the tests that follow."""
    from kubernetes import client

    selector = "app.kubernetes.io/name=gpu-binpack"
    rbac = client.RbacAuthorizationV1Api(lab.api_client)
    lab.apps.delete_collection_namespaced_deployment("kube-system", label_selector=selector)
    lab.core.delete_collection_namespaced_config_map("kube-system", label_selector=selector)
    lab.core.delete_collection_namespaced_service_account("kube-system", label_selector=selector)
    rbac.delete_collection_namespaced_role("kube-system", label_selector=selector)
    rbac.delete_collection_namespaced_role_binding("kube-system", label_selector=selector)
    rbac.delete_collection_cluster_role_binding(label_selector=selector)
