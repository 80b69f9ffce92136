"""Workloads and quotas in DRA mode, on the lab's real control plane: the training_workloads role submits a Job that
asks for its GPUs through a ResourceClaimTemplate, kube-controller-manager makes the pod's ResourceClaim from it and
kube-scheduler allocates the devices on a node in dra mode (the DRA-driver double publishes its ResourceSlices); the
tenancy role's quota on the gpu.nvidia.com device class refuses a claim over it. Idempotence, check mode, a changed
request, deletion and bad input, with the roles run as a user runs them (playbooks/workloads.yml, tenancy.yml).

The test's node is its own (created and deleted here) and untainted, since the role's Jobs carry no toleration; it is
put in dra mode by the nvidia_dra_driver role's tag of playbooks/cluster.yml with an inventory of that node only, as
tests/integration/test_dra.py does, so the lab's shared nodes are left alone.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

import cluster
import config as lab_config
from conftest import ROOT, Lab, playbook_env, recap_changed, run_playbook, wait_for

LAB_INVENTORY = "inventories/lab/hosts.yml"
H100 = "NVIDIA H100 80GB HBM3"
NODE = "draw-h100-0"
POOL = lab_config.NodePool("draw-h100", 1, False, "64", "512Gi", lab_config.GpuSpec(H100, 8, 81559, True))
PRODUCT_CLASSES = [{"name": "h100.nvidia.com", "product": H100}]
MODE_LABEL = "nvidia.com/gpu.deploy.dra-driver"
HOLD = cluster.HOLD_RUNNING_ANNOTATION
SUFFIX = uuid.uuid4().hex[:6]
TEAM = f"draw-{SUFFIX}"  # the training job's team: 4 gpu.nvidia.com devices
SMALL = f"draws-{SUFFIX}"  # a team with 2 gpu.nvidia.com devices
SELECTOR = f"device.attributes['gpu.nvidia.com'].productName == '{H100}'"
# Held Running (the lab's kwok completes other pods at once, and a claim made from a template goes with its pod).
JOB = {"name": "bert-claim", "kind": "pytorch", "gpus": 4, "cpu": "4", "memory": "16Gi", "gpu_request": "claim",
       "selectors": [SELECTOR], "annotations": {HOLD: "true"}}


def resource_api(lab: Lab):  # noqa: ANN201
    from kubernetes import client

    return client.ResourceV1Api(lab.api_client)


def run_dra_role(lab: Lab, mode: str) -> tuple[int, str]:
    """playbooks/cluster.yml, the nvidia_dra_driver tag only, with the test's node as the only GPU node."""
    inventory = {"all": {"children": {
        "gpu_nodes": {"hosts": {NODE: {"nvidia_dra_driver_allocation_mode": mode}}},
        "cluster_control": {
            "hosts": {"localhost": {"ansible_connection": "local",
                                    "ansible_python_interpreter": str(ROOT / ".venv" / "bin" / "python")}},
            "vars": {"gpu_cluster_kubeconfig": str(lab.kubeconfig),
                     "nvidia_dra_driver_product_classes": PRODUCT_CLASSES}}}}}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hosts.yml"
        path.write_text(yaml.safe_dump(inventory))
        result = subprocess.run(["ansible-playbook", "-i", str(path), "playbooks/cluster.yml", "--tags",
                                 "nvidia_dra_driver"], cwd=ROOT, env=playbook_env(), capture_output=True, text=True,
                                check=False, timeout=600)
    return result.returncode, result.stdout + result.stderr


def slice_devices(lab: Lab) -> int:
    return sum(len(item.spec.devices or []) for item in resource_api(lab).list_resource_slice().items
               if item.spec.driver == "gpu.nvidia.com" and item.spec.node_name == NODE)


def advertised(lab: Lab) -> int:
    return int((lab.core.read_node(NODE).status.allocatable or {}).get("nvidia.com/gpu", "0"))


@pytest.fixture(scope="module")
def dra_node(lab: Lab) -> Iterator[str]:
    """The test's 8-GPU H100 node, in dra mode: its GPUs in a ResourceSlice, none as nvidia.com/gpu."""
    lab.core.create_node(cluster.node_manifest(NODE, POOL))
    try:
        wait_for(lambda: advertised(lab) == 8, 120, f"{NODE} Ready with its GPUs advertised")
        rc, output = run_dra_role(lab, "dra")
        assert rc == 0, output[-3000:]
        wait_for(lambda: slice_devices(lab) == 8 and advertised(lab) == 0, 60, f"{NODE}'s 8 devices in a slice")
        yield NODE
    finally:
        run_dra_role(lab, "device-plugin")
        lab.core.delete_node(NODE)
        wait_for(lambda: slice_devices(lab) == 0, 60, f"{NODE}'s ResourceSlice to go")


def tenancy(lab: Lab, tmp_path: Path, *args: str) -> tuple[int, str]:
    """playbooks/tenancy.yml with the two teams (and the DRA role's product classes, which the quotas cover)."""
    extra = tmp_path / "teams.yml"
    extra.write_text(yaml.safe_dump({
        "nvidia_dra_driver_product_classes": PRODUCT_CLASSES,
        "tenancy_teams": [
            {"name": TEAM, "members": {"users": ["trainer"]}, "device_classes": {"gpu.nvidia.com": 4},
             "cpu": "16", "memory": "64Gi"},
            {"name": SMALL, "members": {"users": ["intern"]}, "gpus": {"nvidia.com/gpu": 8},
             "device_classes": {"gpu.nvidia.com": 2}}]}))
    return run_playbook(lab, "tenancy.yml", "-i", LAB_INVENTORY, "-e", f"@{extra}", *args)


def workloads(lab: Lab, jobs: list[dict], *args: str) -> tuple[int, str]:
    return run_playbook(lab, "workloads.yml", "-i", LAB_INVENTORY, "-e", f"training_workloads_namespace={TEAM}",
                        "-e", json.dumps({"training_workloads_jobs": jobs}), *args)


@pytest.fixture(scope="module")
def teams(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    rc, output = tenancy(lab, tmp_path_factory.mktemp("teams"))
    assert rc == 0, output[-3000:]
    yield [TEAM, SMALL]
    for name in (TEAM, SMALL):
        lab.core.delete_namespace(name)
    wait_for(lambda: not {TEAM, SMALL} & {n.metadata.name for n in lab.core.list_namespace().items}, 180,
             "the teams' namespaces to be deleted")


def claims_of(lab: Lab, namespace: str) -> list:
    return resource_api(lab).list_namespaced_resource_claim(namespace).items


@pytest.fixture(scope="module")
def submitted(lab: Lab, dra_node: str, teams: list[str]):  # noqa: ANN201
    rc, output = workloads(lab, [JOB])
    assert rc == 0, output[-3000:]
    assert "would violate PodSecurity" not in output, output[-3000:]

    def bound() -> object:
        pods = lab.core.list_namespaced_pod(TEAM, label_selector=f"job-name={JOB['name']}").items
        return pods[0] if pods and pods[0].spec.node_name else None

    return wait_for(bound, 120, "the claim job's pod to be bound")


def allocated(lab: Lab) -> object:
    claims = claims_of(lab, TEAM)
    return claims[0] if len(claims) == 1 and claims[0].status and claims[0].status.allocation else None


# -- training_workloads in claim mode -----------------------------------------------------------------------------


def test_the_claim_is_made_from_the_template_and_allocated_on_the_dra_node(lab: Lab, submitted):
    pod = submitted
    assert pod.spec.node_name == NODE
    container = pod.spec.containers[0]
    assert [claim.name for claim in container.resources.claims] == ["gpus"]
    assert "nvidia.com/gpu" not in (container.resources.limits or {})
    assert [(c.name, c.resource_claim_template_name) for c in pod.spec.resource_claims] == [("gpus", JOB["name"])]
    # The template is the role's, exactly 4 devices of gpu.nvidia.com with the selector.
    template = resource_api(lab).read_namespaced_resource_claim_template(JOB["name"], TEAM)
    assert template.metadata.labels["app.kubernetes.io/managed-by"] == "gpu-cluster"
    [request] = template.spec.spec.devices.requests
    assert (request.exactly.device_class_name, request.exactly.count, request.exactly.selectors[0].cel.expression) == \
        ("gpu.nvidia.com", 4, SELECTOR)
    # kube-controller-manager made the pod its claim (owned by the pod); kube-scheduler allocated it on the node.
    claim = wait_for(lambda: allocated(lab), 60, "the pod's claim to be allocated")
    assert [(ref.kind, ref.name) for ref in claim.metadata.owner_references] == [("Pod", pod.metadata.name)]
    assert claim.metadata.labels["app.kubernetes.io/name"] == JOB["name"]  # the template's claim labels
    results = claim.status.allocation.devices.results
    assert len(results) == 4 and {r.pool for r in results} == {NODE} and {r.request for r in results} == {"gpus"}
    live = lab.core.read_namespaced_pod(pod.metadata.name, TEAM)
    assert [(s.name, s.resource_claim_name) for s in live.status.resource_claim_statuses] == \
        [("gpus", claim.metadata.name)]


def test_a_second_run_and_a_check_run_change_nothing(lab: Lab, submitted, tmp_path: Path):
    for mode in ((), ("--check",)):
        rc, output = workloads(lab, [JOB], *mode)
        assert rc == 0 and recap_changed(output) == 0, output[-3000:]
        rc, output = tenancy(lab, tmp_path, *mode)
        assert rc == 0 and recap_changed(output) == 0, output[-3000:]


def test_a_changed_request_replaces_the_template_as_check_mode_predicts(lab: Lab, submitted):
    """A template's spec is immutable: the role deletes it and applies it again (the Job is unchanged)."""
    before = resource_api(lab).read_namespaced_resource_claim_template(JOB["name"], TEAM).metadata.uid
    changed = [{**JOB, "device_class": "h100.nvidia.com", "selectors": []}]
    rc, output = workloads(lab, changed, "--check")
    assert rc == 0 and recap_changed(output) == 1, output[-3000:]
    assert resource_api(lab).read_namespaced_resource_claim_template(JOB["name"], TEAM).metadata.uid == before
    rc, output = workloads(lab, changed)
    assert rc == 0 and recap_changed(output) == 2, output[-3000:]  # deleted, applied
    template = resource_api(lab).read_namespaced_resource_claim_template(JOB["name"], TEAM)
    assert template.metadata.uid != before
    [request] = template.spec.spec.devices.requests
    assert request.exactly.device_class_name == "h100.nvidia.com" and not request.exactly.selectors
    rc, output = workloads(lab, changed)
    assert rc == 0 and recap_changed(output) == 0, output[-3000:]
    assert allocated(lab), "the running pod keeps the claim it was given"


def test_bad_claim_input_is_refused_naming_the_path_before_any_change(lab: Lab, submitted):
    jobs = [{**JOB, "name": "fresh-claim"},
            {**JOB, "name": "bad-mode", "gpu_request": "dra"},
            {**JOB, "name": "bad-count", "gpus": 0},
            {**JOB, "name": "bad-class", "device_class": ""}]
    rc, output = workloads(lab, jobs)
    assert rc != 0, output[-3000:]
    for expected in ("training_workloads_jobs[1].gpu_request='dra'; allowed: extended-resource, claim",
                     "training_workloads_jobs[2].gpus=0; allowed: a whole number >= 1",
                     "training_workloads_jobs[3].device_class=''; allowed: a DeviceClass name"):
        assert expected in output, output[-3000:]
    rc, output = run_playbook(lab, "workloads.yml", "-i", LAB_INVENTORY, "-e", f"training_workloads_namespace={TEAM}",
                              "-e", "training_workloads_gpu_request=dra")
    assert rc != 0 and "training_workloads_gpu_request" in output and "dra" in output, output[-3000:]
    with pytest.raises(ApiException):
        resource_api(lab).read_namespaced_resource_claim_template("fresh-claim", TEAM)
    with pytest.raises(ApiException):
        lab.batch.read_namespaced_job("fresh-claim", TEAM)


def test_a_selector_the_cel_compiler_refuses_is_refused_before_any_change(lab: Lab, submitted):
    """Issue 35: the scripts' ConfigMap was applied, then the API server's CEL compiler refused the template. Now the
    preflight's server-side dry run asks it first, and the message names the job as the user wrote it."""
    scripts = lab.core.read_namespaced_config_map("training-scripts", TEAM).metadata.resource_version
    jobs = [{**JOB, "name": "fresh-cel", "selectors": ["device.attributes['gpu.nvidia.com'].productName == 'x'"]},
            {**JOB, "name": "bad-cel", "selectors": ["device.attributes['gpu.nvidia.com'].productName =="]}]
    for args in ((), ("--check",)):
        rc, output = workloads(lab, jobs, *args)
        assert rc != 0, output[-3000:]
        assert ("training_workloads_jobs[1] (bad-cel): the API server refuses its ResourceClaimTemplate (dry run, "
                "nothing applied): ") in output, output[-3000:]
        assert "compil" in output and "training_workloads_jobs[0]" not in output, output[-3000:]
        for name in ("fresh-cel", "bad-cel", "dry-run-fresh-cel", "dry-run-bad-cel"):
            with pytest.raises(ApiException):
                resource_api(lab).read_namespaced_resource_claim_template(name, TEAM)
        with pytest.raises(ApiException):
            lab.batch.read_namespaced_job("fresh-cel", TEAM)
        assert lab.core.read_namespaced_config_map("training-scripts", TEAM).metadata.resource_version == scripts


# -- tenancy quotas on device classes -----------------------------------------------------------------------------


def claim(count: int, device_class: str = "gpu.nvidia.com") -> dict:
    exactly = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"c-{uuid.uuid4().hex[:6]}"},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}}


def refused(lab: Lab, namespace: str, body: dict) -> str:
    with pytest.raises(ApiException) as refusal:
        resource_api(lab).create_namespaced_resource_claim(namespace, body)
    assert refusal.value.status == 403, refusal.value.body
    return json.loads(refusal.value.body)["message"]


def test_the_teams_quota_covers_each_device_class(lab: Lab, teams):
    hard = lab.core.read_namespaced_resource_quota("team-quota", SMALL).spec.hard
    assert {key: value for key, value in hard.items() if "deviceclass" in key} == {
        "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "2",
        "mig.nvidia.com.deviceclass.resource.k8s.io/devices": "0",
        "h100.nvidia.com.deviceclass.resource.k8s.io/devices": "0"}
    assert hard["requests.nvidia.com/gpu"] == "8"


def test_a_deviceclass_quota_of_two_refuses_a_claim_for_four(lab: Lab, teams):
    wait_for(lambda: lab.core.read_namespaced_resource_quota("team-quota", SMALL).status.hard, 30, "the quota's status")
    message = refused(lab, SMALL, claim(4))
    assert "exceeded quota: team-quota" in message, message
    assert "requested: gpu.nvidia.com.deviceclass.resource.k8s.io/devices=4" in message, message
    assert "limited: gpu.nvidia.com.deviceclass.resource.k8s.io/devices=2" in message, message
    # A class the team was given none of (the product class) is refused too: no way around the quota.
    assert "h100.nvidia.com.deviceclass.resource.k8s.io/devices=0" in refused(lab, SMALL, claim(1, "h100.nvidia.com"))
    resource_api(lab).create_namespaced_resource_claim(SMALL, claim(2))  # within it


# -- deletion -----------------------------------------------------------------------------------------------------


def test_state_absent_deletes_the_job_and_its_template(lab: Lab, submitted):
    changed = [{**JOB, "device_class": "h100.nvidia.com", "selectors": []}]
    rc, output = workloads(lab, changed, "-e", "training_workloads_state=absent")
    assert rc == 0, output[-3000:]
    assert not lab.batch.list_namespaced_job(TEAM).items
    assert not resource_api(lab).list_namespaced_resource_claim_template(TEAM).items
    wait_for(lambda: not claims_of(lab, TEAM), 60, "the pod's claim to go with its pod")
    rc, output = workloads(lab, changed, "-e", "training_workloads_state=absent")
    assert rc == 0 and recap_changed(output) == 0, output[-3000:]
