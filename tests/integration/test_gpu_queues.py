"""roles/gpu_queues against the lab's real API server and the real Kueue (v0.17.0, built from source; the lab runs its
controller with the role's configuration and ServiceAccount, and the API server calls its webhooks): team quotas
lent and reclaimed in the cohort, all-or-nothing admission of a distributed job, a job over every quota left queued
with Kueue's reason, teams removed from the data keeping their queues and workloads, idempotence and check mode, and
bad input refused before any change.

The test's teams get their own two simulated 8-GPU nodes (tainted, so no other test's pods land there) and a flavor
that selects them; Kueue adds the flavor's node labels to the admitted pods."""

from __future__ import annotations

import json
import uuid

import pytest
from kubernetes import client

import cluster
from conftest import (TEST_LABEL, Lab, add_gpu_nodes, delete_test_namespaces, recap_changed, remove_binpack_scheduler,
                      remove_nodes, run_playbook, wait_for)

LAB_INVENTORY = "inventories/lab/hosts.yml"
QUEUES = ("-i", LAB_INVENTORY, "--tags", "gpu_queues")
NODES = ["queue-0", "queue-1"]
NODE_LABEL = "gpu-lab.dev/queue-test"
TAINT = {"key": NODE_LABEL, "value": "true", "effect": "NoSchedule"}
KUEUE = ("kueue.x-k8s.io", "v1beta2")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def settings(alpha: str, beta: str, **changes) -> dict:
    values = {
        "gpu_queues_enabled": True,
        "gpu_queues_flavors": [{"name": "queue-test", "node_labels": {NODE_LABEL: "true"}, "tolerations": [
            {"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}]}],
        "gpu_queues_teams": [
            {"name": alpha, "gpus": {"nvidia.com/gpu": 8}, "cpu": "64", "memory": "256Gi"},
            {"name": beta, "gpus": {"nvidia.com/gpu": 8}, "cpu": "64", "memory": "256Gi"}],
        "gpu_queues_wait_for_pods_ready_timeout": 120,
    }
    values.update(changes)
    return values


def run_role(lab: Lab, values: dict, *extra: str) -> tuple[int, str]:
    return run_playbook(lab, "queues.yml", *QUEUES, "-e", json.dumps(values), *extra)


def job(name: str, gpus: int, workers: int = 1) -> dict:
    """A Job for the team's LocalQueue: `workers` pods of `gpus` GPUs each (Pod Security restricted), held Running."""
    return {"metadata": {"name": name, "labels": {QUEUE_LABEL: "gpu"}}, "spec": {
        "parallelism": workers, "completions": workers, "backoffLimit": 0,
        "template": {"metadata": {"annotations": {cluster.HOLD_RUNNING_ANNOTATION: "true"}}, "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "tolerations": [{"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"},
                            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "train", "image": "registry.invalid/cuda:1", "securityContext": {
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}, "resources": {
                "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)},
                "limits": {"nvidia.com/gpu": str(gpus)}}}]}}}}


def workload_of(lab: Lab, namespace: str, job_name: str) -> dict | None:
    items = client.CustomObjectsApi(lab.api_client).list_namespaced_custom_object(*KUEUE, namespace, "workloads")["items"]
    return next((w for w in items if any(o.get("name") == job_name for o in w["metadata"].get("ownerReferences", []))), None)


def condition(workload: dict | None, kind: str) -> dict:
    return next((c for c in ((workload or {}).get("status") or {}).get("conditions", []) if c["type"] == kind), {})


def admitted(lab: Lab, namespace: str, job_name: str) -> bool:
    return condition(workload_of(lab, namespace, job_name), "Admitted").get("status") == "True"


def running_pods(lab: Lab, namespace: str, job_name: str) -> list:
    return [p for p in lab.core.list_namespaced_pod(namespace, label_selector=f"job-name={job_name}").items
            if p.status.phase == "Running" and not p.metadata.deletion_timestamp]


@pytest.fixture(scope="module")
def queue_nodes(lab: Lab):
    # nvidia.com/gpu.product: what gpu_scheduling labels from GPU facts; the training workloads select their product by it.
    add_gpu_nodes(lab, "queue", NODES, NODE_LABEL, TAINT, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    yield NODES
    remove_nodes(lab, NODES)


@pytest.fixture(scope="module")
def teams(lab: Lab, queue_nodes):
    """Two team namespaces, the role applied for them (Kueue deployed), everything the test made removed after."""
    names = [f"it-q{uuid.uuid4().hex[:6]}" for _ in range(2)]
    for name in names:
        # As the tenancy role makes team namespaces: Pod Security restricted (the training workloads require it).
        lab.core.create_namespace({"metadata": {"name": name, "labels": {
            TEST_LABEL: "true", "pod-security.kubernetes.io/enforce": "restricted"}}})
    rc, output = run_role(lab, settings(*names))
    assert rc == 0, output[-4000:]
    yield names, output
    delete_test_namespaces(lab, names)
    custom = client.CustomObjectsApi(lab.api_client)
    for name in names:
        custom.delete_cluster_custom_object(*KUEUE, "clusterqueues", name)
    wait_for(lambda: not [q for q in custom.list_cluster_custom_object(*KUEUE, "clusterqueues")["items"]
                          if q["metadata"]["name"] in names], 60, "the test's ClusterQueues deleted")
    custom.delete_cluster_custom_object(*KUEUE, "resourceflavors", "queue-test")
    uninstall_kueue(lab)


def uninstall_kueue(lab: Lab) -> None:
    """Leave the shared lab as it was: no webhook of Kueue's on the Jobs of the tests that follow (the role itself
    never uninstalls Kueue)."""
    admission = client.AdmissionregistrationV1Api(lab.api_client)
    admission.delete_mutating_webhook_configuration("kueue-mutating-webhook-configuration")
    admission.delete_validating_webhook_configuration("kueue-validating-webhook-configuration")
    lab.core.delete_namespace("kueue-system")
    crds = client.ApiextensionsV1Api(lab.api_client)
    crds.delete_collection_custom_resource_definition(label_selector="app.kubernetes.io/part-of=gpu-queues")
    rbac = client.RbacAuthorizationV1Api(lab.api_client)
    rbac.delete_cluster_role_binding("kueue-manager-rolebinding")
    rbac.delete_cluster_role("kueue-manager-role")
    wait_for(lambda: "kueue-system" not in {n.metadata.name for n in lab.core.list_namespace().items}, 120,
             "Kueue's namespace deleted")


def kueue_footprint(lab: Lab) -> dict:
    """What the role's first change phases would create or touch: the namespaces (names: one being deleted by an
    earlier test may change meanwhile), and with resource versions Kueue's CRDs, cluster RBAC, webhook configurations
    and the ClusterQueues if Kueue's API is served."""
    admission = client.AdmissionregistrationV1Api(lab.api_client)
    rbac = client.RbacAuthorizationV1Api(lab.api_client)
    crds = [c for c in client.ApiextensionsV1Api(lab.api_client).list_custom_resource_definition().items
            if c.spec.group == "kueue.x-k8s.io"]
    footprint = {
        "namespaces": {n.metadata.name for n in lab.core.list_namespace().items},
        "crds": sorted((c.metadata.name, c.metadata.resource_version) for c in crds),
        "cluster_roles": sorted((r.metadata.name, r.metadata.resource_version)
                                for r in rbac.list_cluster_role().items if r.metadata.name.startswith("kueue-")),
        "webhooks": sorted((w.metadata.name, w.metadata.resource_version)
                           for kind in (admission.list_mutating_webhook_configuration,
                                        admission.list_validating_webhook_configuration)
                           for w in kind().items if w.metadata.name.startswith("kueue-")),
    }
    if any(name == "clusterqueues.kueue.x-k8s.io" for name, _ in footprint["crds"]):
        queues = client.CustomObjectsApi(lab.api_client).list_cluster_custom_object(*KUEUE, "clusterqueues")["items"]
        footprint["clusterqueues"] = sorted((q["metadata"]["name"], q["metadata"]["resourceVersion"]) for q in queues)
    return footprint


def unfolded(output: str) -> str:
    """The run's output with the result format's YAML undone where it changes a message: lines folded at spaces, and
    a single-quoted scalar's '' for each quote (ansible.cfg: callback_result_format = yaml)."""
    return " ".join(output.replace("''", "'").split())


# Before the tests that deploy Kueue (the module's `teams` fixture): the refusal must come before Kueue is applied.
@pytest.mark.parametrize("mode", ["real run", "check mode"])
def test_a_lending_limit_above_a_teams_quota_is_refused_before_kueue_is_applied(lab: Lab, mode):
    """Issue 35: Kueue, its webhooks, the flavors and the cohort were applied, then Kueue's webhook refused the queue,
    naming no input. The teams come from tenancy_teams, as gpu_queues_teams' default takes them: the refusal names
    that input, the team, the value and what is allowed, and nothing in the cluster changed."""
    alpha, beta = (f"it-q{uuid.uuid4().hex[:6]}" for _ in range(2))
    values = settings(alpha, beta)
    teams = values.pop("gpu_queues_teams")
    teams[1]["gpus"] = {"nvidia.com/gpu": 4}
    teams[1]["queue"] = {"lending_limit": 6}
    values["tenancy_teams"] = teams
    before = kueue_footprint(lab)
    rc, output = run_role(lab, values, *(["--check"] if mode == "check mode" else []))
    assert rc != 0, output[-3000:]
    assert ("tenancy_teams[1].queue.lending_limit=6 is more than the team's nominal quota "
            "(tenancy_teams[1].gpus['nvidia.com/gpu']=4); allowed: 0 to 4") in unfolded(output), output[-3000:]
    assert recap_changed(output) == 0
    after = kueue_footprint(lab)
    assert after.pop("namespaces") - before.pop("namespaces") == set()
    assert after == before


def test_kueue_runs_with_the_roles_configuration_and_answers_its_webhooks(lab: Lab, teams):
    names, _ = teams
    # Kueue's certificate management filled the Secret and the webhooks' CA bundles (the role never sends them).
    secret = lab.core.read_namespaced_secret("kueue-webhook-server-cert", "kueue-system")
    assert {"tls.crt", "tls.key", "ca.crt"} <= set(secret.data or {})
    hooks = client.AdmissionregistrationV1Api(lab.api_client).read_validating_webhook_configuration(
        "kueue-validating-webhook-configuration")
    assert all(h.client_config.ca_bundle for h in hooks.webhooks)
    # The webhook validates: a ClusterQueue that Kueue's own validation refuses never reaches etcd.
    custom = client.CustomObjectsApi(lab.api_client)
    with pytest.raises(client.ApiException) as refused:
        custom.create_cluster_custom_object(*KUEUE, "clusterqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "it-bad-queue"},
            "spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                {"name": "queue-test", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8,
                                                      "lendingLimit": 9}]}]}]}})
    assert "vclusterqueue.kb.io" in refused.value.body or "lendingLimit" in refused.value.body
    for name in names:
        queue = custom.get_cluster_custom_object(*KUEUE, "clusterqueues", name)
        active = next(c for c in queue["status"]["conditions"] if c["type"] == "Active")
        assert active["status"] == "True", active
        assert custom.get_namespaced_custom_object(*KUEUE, name, "localqueues", "gpu")["spec"]["clusterQueue"] == name


def test_a_second_run_and_a_check_run_change_nothing(lab: Lab, teams):
    names, _ = teams
    rc, output = run_role(lab, settings(*names))
    assert rc == 0 and recap_changed(output) == 0, output[-4000:]
    rc, output = run_role(lab, settings(*names), "--check")
    assert rc == 0 and recap_changed(output) == 0, output[-4000:]


def test_crds_of_another_release_are_sent_again_and_kueues_ca_bundle_stays(lab: Lab, teams):
    names, _ = teams
    crds = client.ApiextensionsV1Api(lab.api_client)
    crds.patch_custom_resource_definition("topologies.kueue.x-k8s.io",
                                          {"metadata": {"labels": {"gpu-cluster.dev/kueue-version": "v0.16.0"}}})
    rc, output = run_role(lab, settings(*names))
    assert rc == 0 and "changed: [localhost]" in output.split("Apply Kueue's CRDs")[1].split("TASK")[0], output[-4000:]
    assert crds.read_custom_resource_definition("topologies.kueue.x-k8s.io").metadata.labels[
        "gpu-cluster.dev/kueue-version"] == "v0.17.0"
    # Server-side apply: the conversion webhook's CA bundle that Kueue injected is Kueue's field, kept.
    assert crds.read_custom_resource_definition("workloads.kueue.x-k8s.io").spec.conversion.webhook.client_config.ca_bundle


def preempted(workload: dict | None) -> bool:
    """Kueue preempted the workload: its Evicted condition says so, or (once Kueue has reset that condition on a later
    admission) its eviction count by reason does (status.schedulingStats.evictions)."""
    evicted = condition(workload, "Evicted")
    if evicted.get("status") == "True" and evicted.get("reason") == "Preempted":
        return True
    stats = ((workload or {}).get("status") or {}).get("schedulingStats") or {}
    return any(e.get("reason") == "Preempted" and e.get("count", 0) > 0 for e in stats.get("evictions") or [])


def test_idle_gpus_are_borrowed_and_reclaimed_by_preempting_the_borrower(lab: Lab, teams):
    alpha, beta = teams[0]
    try:
        lab.batch.create_namespaced_job(alpha, job("own", 8))
        wait_for(lambda: admitted(lab, alpha, "own") and len(running_pods(lab, alpha, "own")) == 1, 90,
                 "alpha's own job running")
        # Beyond alpha's quota of 8: admitted on beta's idle GPUs.
        lab.batch.create_namespaced_job(alpha, job("borrowed", 8))
        wait_for(lambda: admitted(lab, alpha, "borrowed") and len(running_pods(lab, alpha, "borrowed")) == 1, 90,
                 "alpha's borrowing job running")
        # Beta claims its quota back: the borrowing workload is preempted, alpha's own stays, beta's is admitted.
        lab.batch.create_namespaced_job(beta, job("claim", 8))
        wait_for(lambda: admitted(lab, beta, "claim"), 120, "beta's job admitted after reclaiming its quota")
        borrowed = workload_of(lab, alpha, "borrowed")
        assert preempted(borrowed), (borrowed or {}).get("status")
        own = workload_of(lab, alpha, "own")
        assert admitted(lab, alpha, "own") and not preempted(own), (own or {}).get("status")
        wait_for(lambda: not running_pods(lab, alpha, "borrowed"), 60, "the preempted job's pod gone")
    finally:
        # Whatever happened above: the quota this test took is given back, or every later test here waits on it.
        for namespace, names in ((alpha, ("own", "borrowed")), (beta, ("claim",))):
            for name in names:
                try:
                    lab.batch.delete_namespaced_job(name, namespace, propagation_policy="Foreground")
                except client.ApiException as error:
                    if error.status != 404:
                        raise
        wait_for(lambda: not lab.core.list_namespaced_pod(alpha).items and not lab.core.list_namespaced_pod(beta).items,
                 120, "the test's pods gone")


def test_a_distributed_job_is_admitted_only_when_all_its_workers_fit(lab: Lab, teams):
    alpha, beta = teams[0]
    lab.batch.create_namespaced_job(beta, job("holder", 4))
    wait_for(lambda: admitted(lab, beta, "holder"), 90, "beta's 4-GPU job admitted")
    # 4 workers x 4 GPUs = 16: alpha's 8 plus the 8 of beta, of which 4 are in use: does not fit, no pod starts.
    lab.batch.create_namespaced_job(alpha, job("ddp", 4, workers=4))
    wait_for(lambda: workload_of(lab, alpha, "ddp"), 60, "the distributed job's Workload")
    wait_for(lambda: condition(workload_of(lab, alpha, "ddp"), "QuotaReserved").get("status") == "False", 60,
             "Kueue to decide the distributed job does not fit")
    assert lab.batch.read_namespaced_job("ddp", alpha).spec.suspend is True
    assert lab.core.list_namespaced_pod(alpha, label_selector="job-name=ddp").items == []
    # Beta's job ends: all four workers are admitted together and run.
    lab.batch.delete_namespaced_job("holder", beta, propagation_policy="Foreground")
    wait_for(lambda: admitted(lab, alpha, "ddp") and len(running_pods(lab, alpha, "ddp")) == 4, 120,
             "the four workers admitted and running together")
    nodes = {p.spec.node_name for p in running_pods(lab, alpha, "ddp")}
    assert nodes <= set(NODES)
    lab.batch.delete_namespaced_job("ddp", alpha, propagation_policy="Foreground")
    wait_for(lambda: not lab.core.list_namespaced_pod(alpha).items, 120, "the workers gone")


def test_a_job_over_every_quota_stays_queued_with_kueues_reason(lab: Lab, teams):
    alpha, _ = teams[0]
    lab.batch.create_namespaced_job(alpha, job("too-big", 8, workers=3))
    wait_for(lambda: condition(workload_of(lab, alpha, "too-big"), "QuotaReserved").get("status") == "False", 60,
             "Kueue's verdict on the 24-GPU job")
    reason = condition(workload_of(lab, alpha, "too-big"), "QuotaReserved")
    assert reason["reason"] == "Pending" and "insufficient quota for nvidia.com/gpu" in reason["message"], reason
    assert lab.batch.read_namespaced_job("too-big", alpha).spec.suspend is True
    lab.batch.delete_namespaced_job("too-big", alpha, propagation_policy="Foreground")


def test_a_team_removed_from_the_data_keeps_its_queue_and_running_workloads(lab: Lab, teams):
    (alpha, beta), _ = teams
    lab.batch.create_namespaced_job(beta, job("keeps-running", 2))
    wait_for(lambda: admitted(lab, beta, "keeps-running") and running_pods(lab, beta, "keeps-running"), 90,
             "beta's job running")
    only_alpha = settings(alpha, beta)
    only_alpha["gpu_queues_teams"] = only_alpha["gpu_queues_teams"][:1]
    rc, output = run_role(lab, only_alpha)
    assert rc == 0, output[-4000:]
    assert f"Kept, not a present team of gpu_queues_teams: ClusterQueue {beta}" in output
    custom = client.CustomObjectsApi(lab.api_client)
    assert custom.get_cluster_custom_object(*KUEUE, "clusterqueues", beta)["spec"]["cohortName"] == "gpu-teams"
    assert custom.get_namespaced_custom_object(*KUEUE, beta, "localqueues", "gpu")
    assert admitted(lab, beta, "keeps-running") and running_pods(lab, beta, "keeps-running")
    lab.batch.delete_namespaced_job("keeps-running", beta, propagation_policy="Foreground")


@pytest.mark.parametrize("change, expected", [
    ({"gpu_queues_teams": [{"name": "TEAM", "queue": {"flavor": "v100"}}]}, "gpu_queues_teams[0]="),
    ("unknown flavor", "gpu_queues_teams[0].queue.flavor='v100' is not a flavor of gpu_queues_flavors; allowed: queue-test"),
    ("no namespace", "(team it-nonexistent-team): the namespace it-nonexistent-team does not exist"),
    ("over the cluster", "gpus['nvidia.com/gpu']=100 exceeds the cluster: the nodes of flavor queue-test "
                         "(gpu-lab.dev/queue-test=true) have 16 allocatable; allowed: at most 16"),
    ({"gpu_queues_wait_for_pods_ready_timeout": "5m"}, "gpu_queues_wait_for_pods_ready_timeout"),
])
def test_bad_input_is_refused_before_any_change(lab: Lab, teams, change, expected):
    (alpha, beta), _ = teams
    values = settings(alpha, beta)
    if change == "unknown flavor":
        values["gpu_queues_teams"][0]["queue"] = {"flavor": "v100"}
    elif change == "no namespace":
        values["gpu_queues_teams"].append({"name": "it-nonexistent-team", "gpus": {"nvidia.com/gpu": 1}})
    elif change == "over the cluster":
        values["gpu_queues_teams"][0]["gpus"] = {"nvidia.com/gpu": 100}
    else:
        values.update(change)
    custom = client.CustomObjectsApi(lab.api_client)
    before = custom.get_cluster_custom_object(*KUEUE, "clusterqueues", alpha)["metadata"]["resourceVersion"]
    rc, output = run_role(lab, values)
    assert rc != 0 and expected in output, output[-3000:]
    assert recap_changed(output) == 0
    assert custom.get_cluster_custom_object(*KUEUE, "clusterqueues", alpha)["metadata"]["resourceVersion"] == before


@pytest.fixture
def binpack_scheduler(lab: Lab):
    """The gpu_scheduling role's bin-packing scheduler, removed after (the role leaves it when turned off)."""
    rc, output = run_playbook(lab, "cluster.yml", "-i", LAB_INVENTORY, "--tags", "gpu_scheduling_preflight,gpu_scheduling_apply",
                              "-e", '{"gpu_scheduling_binpack": true}')
    assert rc == 0, output[-3000:]
    yield "gpu-binpack"
    remove_binpack_scheduler(lab)


def test_training_workloads_go_through_the_team_queue_and_the_binpack_scheduler(lab: Lab, teams, binpack_scheduler):
    (alpha, _), _ = teams
    ddp = {"name": "queued-ddp", "kind": "pytorch-distributed", "workers": 2, "gpus": 4,
           "product": "NVIDIA-H100-80GB-HBM3", "cpu": "1", "memory": "1Gi",
           "annotations": {cluster.HOLD_RUNNING_ANNOTATION: "true"},
           # The role's workers are spread over nodes by required anti-affinity; tolerate the test nodes' taint.
           }
    values = {"training_workloads_namespace": alpha, "training_workloads_jobs": [ddp],
              "training_workloads_queue_name": "gpu", "training_workloads_scheduler_name": binpack_scheduler}
    rc, output = run_playbook(lab, "workloads.yml", "-i", LAB_INVENTORY, "-e", json.dumps(values))
    assert rc == 0, output[-3000:]
    submitted = lab.batch.read_namespaced_job("queued-ddp", alpha)
    assert submitted.metadata.labels[QUEUE_LABEL] == "gpu"
    wait_for(lambda: admitted(lab, alpha, "queued-ddp"), 90, "the team queue to admit the workload")
    # Admitted with the flavor's node labels; the taint of the test's nodes is the flavor's business, not the job's:
    # Kueue adds the flavor's tolerations too, so the pods can only land there.
    pods = wait_for(lambda: [p for p in lab.core.list_namespaced_pod(alpha, label_selector="job-name=queued-ddp").items
                             if p.spec.node_name] or None, 90, "the workers bound")
    for pod in pods:
        assert pod.spec.scheduler_name == binpack_scheduler
        assert pod.spec.node_selector.get(NODE_LABEL) == "true"
        assert pod.spec.node_name in NODES
    lab.batch.delete_namespaced_job("queued-ddp", alpha, propagation_policy="Foreground")
