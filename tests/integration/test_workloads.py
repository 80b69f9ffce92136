"""roles/training_workloads against the lab's real API server: every example workload admitted in a team namespace
(Pod Security restricted, the team's GPU quota), scheduled by kube-scheduler onto simulated nodes of the product it
asks for, the distributed job's workers on different nodes with the rendezvous environment; idempotence, check mode,
deletion, and bad input refused before any change."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from conftest import Lab, recap_changed, run_playbook, wait_for

LAB_INVENTORY = "inventories/lab/hosts.yml"
TEAM = f"tw-{uuid.uuid4().hex[:6]}"
PRODUCT = "nvidia.com/gpu.product"
# The role's default workloads: job -> (pods, GPUs per pod, product).
EXPECTED = {"tf-mnist-1gpu": (1, 1, "NVIDIA-A100-SXM4-40GB"), "pytorch-resnet-1gpu": (1, 1, "NVIDIA-A100-SXM4-40GB"),
            "pytorch-resnet-4gpu": (1, 4, "NVIDIA-H100-80GB-HBM3"), "pytorch-ddp": (2, 4, "NVIDIA-H100-80GB-HBM3")}


DEFAULT_JOBS = yaml.safe_load((Path(__file__).resolve().parents[2] / "roles" / "training_workloads" / "defaults" /
                               "main.yml").read_text())["training_workloads_jobs"]
HOLD = "gpu-lab.dev/hold-running"
# The distributed job's workers stay Running (the lab's kwok completes other Job pods at once): its required
# anti-affinity only keeps the second worker off the first one's node while the first one runs. Its label and
# annotation go through the role's per-job metadata.
JOBS = [{**job, "labels": {"example.com/queue": "team-queue"}, "annotations": {HOLD: "true"}}
        if job["name"] == "pytorch-ddp" else job for job in DEFAULT_JOBS]


def workloads(lab: Lab, tmp_path: Path, *args: str) -> tuple[int, str]:
    return run_playbook(lab, "workloads.yml", "-i", LAB_INVENTORY, "-e", f"training_workloads_namespace={TEAM}",
                        "-e", json.dumps({"training_workloads_jobs": JOBS}), *args)


@pytest.fixture(scope="module")
def team(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A team whose GPU quota is exactly what the four workloads ask for together (1 + 1 + 4 + 2 x 4)."""
    extra = tmp_path_factory.mktemp("workloads") / "team.yml"
    extra.write_text(yaml.safe_dump({"tenancy_teams": [
        {"name": TEAM, "members": {"users": ["trainer"]}, "gpus": {"nvidia.com/gpu": 14}, "cpu": "56",
         "memory": "224Gi"}]}))
    rc, output = run_playbook(lab, "tenancy.yml", "-i", LAB_INVENTORY, "-e", f"@{extra}")
    assert rc == 0, output[-3000:]
    yield TEAM
    lab.core.delete_namespace(TEAM)
    wait_for(lambda: TEAM not in {n.metadata.name for n in lab.core.list_namespace().items}, 180,
             f"namespace {TEAM} to be deleted")


@pytest.fixture(scope="module")
def submitted(lab: Lab, team: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    rc, output = workloads(lab, tmp_path_factory.mktemp("submit"))
    assert rc == 0, output[-3000:]
    # Pod Security's warn mode answers a Job whose pods would be refused; the module prints it as a warning.
    assert "would violate PodSecurity" not in output, output[-3000:]

    def scheduled() -> dict | None:
        pods = lab.core.list_namespaced_pod(team).items
        by_job: dict = {}
        for pod in pods:
            by_job.setdefault(pod.metadata.labels.get("job-name"), []).append(pod)
        complete = all(len(by_job.get(job, [])) >= count and all(p.spec.node_name for p in by_job[job])
                       for job, (count, _, _) in EXPECTED.items())
        return by_job if complete else None

    return wait_for(scheduled, 120, "every workload's pods to be bound to nodes")


def test_every_workload_lands_on_a_node_of_its_product(lab: Lab, submitted):
    products = {node.metadata.name: node.metadata.labels.get(PRODUCT) for node in lab.core.list_node().items}
    for job, (count, gpus, product) in EXPECTED.items():
        pods = submitted[job]
        assert len(pods) == count, job
        for pod in pods:
            assert products[pod.spec.node_name] == product, (job, pod.spec.node_name)
            container = pod.spec.containers[0]
            assert container.resources.limits["nvidia.com/gpu"] == str(gpus)
            assert container.security_context.allow_privilege_escalation is False
            assert container.security_context.capabilities.drop == ["ALL"]
            assert pod.spec.security_context.run_as_non_root and pod.spec.security_context.run_as_user == 10001
            assert pod.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    quota = lab.core.read_namespaced_resource_quota("team-quota", TEAM).spec.hard
    assert quota["requests.nvidia.com/gpu"] == "14"


def test_distributed_workers_spread_over_nodes_with_the_rendezvous(lab: Lab, submitted):
    workers = sorted(submitted["pytorch-ddp"],
                     key=lambda p: p.metadata.annotations["batch.kubernetes.io/job-completion-index"])
    assert len({pod.spec.node_name for pod in workers}) == len(workers) == 2
    # Held Running, both at once: the placement is the scheduler's answer for two live workers.
    for pod in workers:
        live = lab.core.read_namespaced_pod(pod.metadata.name, TEAM)
        assert live.status.phase == "Running", (live.metadata.name, live.status.phase)
        assert live.metadata.annotations[HOLD] == "true" and live.metadata.labels["example.com/queue"] == "team-queue"
    assert lab.batch.read_namespaced_job("pytorch-ddp", TEAM).metadata.labels["example.com/queue"] == "team-queue"
    for index, pod in enumerate(workers):
        assert pod.metadata.annotations["batch.kubernetes.io/job-completion-index"] == str(index)
        assert pod.spec.subdomain == "pytorch-ddp" and pod.spec.hostname == f"pytorch-ddp-{index}"
        env = {e.name: e for e in pod.spec.containers[0].env}
        assert env["MASTER_ADDR"].value == "pytorch-ddp-0.pytorch-ddp"
        assert env["WORLD_SIZE"].value == "2" and env["MASTER_PORT"].value == "29500"
        assert env["RANK"].value_from.field_ref.field_path == \
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        assert "--nproc-per-node=4" in pod.spec.containers[0].command
    service = lab.core.read_namespaced_service("pytorch-ddp", TEAM)
    assert service.spec.cluster_ip == "None" and service.spec.selector == {"app.kubernetes.io/name": "pytorch-ddp"}


def test_second_run_and_check_mode_change_nothing(lab: Lab, submitted, tmp_path: Path):
    for mode in ((), ("--check",)):
        rc, output = workloads(lab, tmp_path, *mode)
        assert rc == 0 and recap_changed(output) == 0, output[-3000:]


def test_bad_workloads_fail_before_any_change(lab: Lab, submitted, tmp_path: Path):
    jobs = [{"name": "fresh-job", "kind": "pytorch", "gpus": 1, "product": "X", "cpu": "1", "memory": "1Gi"},
            {"name": "bad", "kind": "jax", "gpus": 0, "product": "NVIDIA H100", "cpu": "1", "memory": "1Gi"}]
    rc, output = workloads(lab, tmp_path, "-e", json.dumps({"training_workloads_jobs": jobs}))
    assert rc != 0, output[-3000:]
    for expected in ("training_workloads_jobs[1].kind='jax'; allowed: tensorflow, pytorch, pytorch-distributed",
                     "training_workloads_jobs[1].gpus=0; allowed: a whole number >= 1",
                     "training_workloads_jobs[1].product='NVIDIA H100'"):
        assert expected in output, output[-3000:]
    with pytest.raises(ApiException):
        lab.batch.read_namespaced_job("fresh-job", TEAM)
    # What the cluster can never run, judged from its own nodes and DeviceClasses before anything is submitted, in a
    # real run and in --check: the lab's H100 nodes have 8 nvidia.com/gpu allocatable each.
    unfit = [{"name": "too-big", "kind": "pytorch", "gpus": 16, "product": "NVIDIA-H100-80GB-HBM3", "cpu": "1",
              "memory": "1Gi"},
             {"name": "nowhere", "kind": "pytorch", "gpus": 1, "product": "NVIDIA-B200", "cpu": "1", "memory": "1Gi"},
             {"name": "no-class", "kind": "pytorch", "gpus": 1, "cpu": "1", "memory": "1Gi", "gpu_request": "claim",
              "device_class": "no-such.nvidia.com"}]
    for mode in ((), ("--check",)):
        rc, output = workloads(lab, tmp_path, "-e", json.dumps({"training_workloads_jobs": unfit}), *mode)
        assert rc != 0, output[-3000:]
        for expected in ("training_workloads_jobs[0].gpus=16: more than any node labelled "
                         "nvidia.com/gpu.product='NVIDIA-H100-80GB-HBM3' can give one pod (largest: 8 nvidia.com/gpu",
                         "training_workloads_jobs[1].product='NVIDIA-B200': no node labelled",
                         "training_workloads_jobs[2].device_class='no-such.nvidia.com' names no DeviceClass"):
            assert expected in " ".join(output.split()), output[-3000:]
        for name in ("too-big", "nowhere", "no-class"):
            with pytest.raises(ApiException):
                lab.batch.read_namespaced_job(name, TEAM)
    # Kubernetes' own namespace: refused by its form, before the cluster is read; another role's: by the cluster check.
    rc, output = run_playbook(lab, "workloads.yml", "-i", LAB_INVENTORY, "-e", "training_workloads_namespace=kube-system")
    assert rc != 0 and 'training_workloads_namespace="kube-system" is not a namespace a role may take' in output, \
        output[-3000:]
    rc, output = run_playbook(lab, "workloads.yml", "-i", LAB_INVENTORY, "-e",
                              "training_workloads_namespace=nvidia-device-plugin")
    assert rc != 0 and "must be an existing team namespace with Pod Security enforce=restricted" in output, \
        output[-3000:]


def test_state_absent_deletes_the_jobs_and_their_pods(lab: Lab, submitted, tmp_path: Path):
    rc, output = workloads(lab, tmp_path, "-e", "training_workloads_state=absent")
    assert rc == 0 and recap_changed(output) == 2, output[-3000:]
    assert not lab.batch.list_namespaced_job(TEAM).items
    wait_for(lambda: not lab.core.list_namespaced_pod(TEAM).items, 60, "the workloads' pods to be deleted")


def test_a_root_workload_is_warned_about_and_its_pods_refused(lab: Lab, submitted, tmp_path: Path):
    """What the warn assertion above would catch: the same Job as root is accepted with a warning, its pods refused."""
    job = [{"name": "as-root", "kind": "pytorch", "gpus": 1, "product": "NVIDIA-H100-80GB-HBM3", "cpu": "1",
            "memory": "1Gi"}]
    extra = ("-e", json.dumps({"training_workloads_jobs": job, "training_workloads_run_as_user": 0}))
    rc, output = workloads(lab, tmp_path, *extra)
    try:
        assert rc == 0 and 'would violate PodSecurity "restricted:v1.37": runAsUser=0' in output, output[-3000:]

        def refused() -> bool:
            events = lab.core.list_namespaced_event(TEAM, field_selector="involvedObject.name=as-root").items
            return any(e.reason == "FailedCreate" and "violates PodSecurity" in e.message for e in events)

        wait_for(refused, 60, "the Job controller's FailedCreate event naming Pod Security")
        assert not lab.core.list_namespaced_pod(TEAM, label_selector="job-name=as-root").items
    finally:
        workloads(lab, tmp_path, *extra, "-e", "training_workloads_state=absent")
