"""roles/tenancy against the lab's real API server: Pod Security, quota, RBAC (SubjectAccessReview), the node pool
admission policy, idempotence and check mode, removal semantics, and bad input refused before any change.

Team names carry a random suffix, so runs never collide; every namespace the tests create is deleted afterwards.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from conftest import Lab, recap_changed, run_playbook, wait_for

LAB_INVENTORY = "inventories/lab/hosts.yml"
SUFFIX = uuid.uuid4().hex[:6]
TEAM_A, TEAM_B = f"ta-{SUFFIX}", f"tb-{SUFFIX}"
ALICE, BOB, VICTOR, GROUP_A = f"alice-{SUFFIX}", f"bob-{SUFFIX}", f"victor-{SUFFIX}", f"devs-{SUFFIX}"
H100 = "NVIDIA-H100-80GB-HBM3"
RESTRICTED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
              "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}


def teams(*extra: dict) -> list[dict]:
    return [{"name": TEAM_A, "members": {"users": [ALICE], "groups": [GROUP_A]}, "viewers": {"users": [VICTOR]},
             "gpus": {"nvidia.com/gpu": 2}, "cpu": "8", "memory": "32Gi"},
            {"name": TEAM_B, "members": {"users": [BOB]}, "gpus": {"nvidia.com/gpu": 8}, "node_pool": H100},
            *extra]


def apply(lab: Lab, tmp_path: Path, team_list: list[dict], *args: str) -> tuple[int, str]:
    extra = tmp_path / f"teams-{uuid.uuid4().hex[:6]}.yml"
    extra.write_text(yaml.safe_dump({"tenancy_teams": team_list}))
    return run_playbook(lab, "tenancy.yml", "-i", LAB_INVENTORY, "-e", f"@{extra}", *args)


def namespace_exists(lab: Lab, name: str) -> bool:
    try:
        lab.core.read_namespace(name)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


def delete_namespaces(lab: Lab, names: list[str]) -> None:
    for name in names:
        try:
            lab.core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
    wait_for(lambda: not any(namespace_exists(lab, n) for n in names), 180, f"namespaces {names} to be deleted")


@pytest.fixture(scope="module")
def applied(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    rc, output = apply(lab, tmp_path_factory.mktemp("tenancy"), teams())
    assert rc == 0, output[-3000:]
    yield output
    delete_namespaces(lab, [TEAM_A, TEAM_B])


def pod(name: str, *, gpus: int = 0, security: dict | None = None, volumes: list | None = None,
        node_selector: dict | None = None) -> dict:
    container = {"name": "main", "image": "registry.example/train:1", "securityContext": security or RESTRICTED,
                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}}
    spec: dict = {"containers": [container], "volumes": volumes or []}
    if volumes:
        container["volumeMounts"] = [{"name": v["name"], "mountPath": "/data"} for v in volumes]
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"metadata": {"name": name}, "spec": spec}


def refusal(lab: Lab, namespace: str, body: dict) -> str:
    """The API server's message refusing the pod (a dry run: nothing is stored either way)."""
    with pytest.raises(ApiException) as refused:
        lab.core.create_namespaced_pod(namespace, body, dry_run="All")
    assert refused.value.status in (403, 422), refused.value.body
    return json.loads(refused.value.body)["message"]


def test_each_team_gets_its_namespace_and_objects(lab: Lab, applied):
    labels = lab.core.read_namespace(TEAM_A).metadata.labels
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
        assert labels[f"pod-security.kubernetes.io/{mode}-version"] == "v1.37"
    assert labels["gpu-cluster.dev/team"] == TEAM_A and labels["app.kubernetes.io/managed-by"] == "gpu-cluster"
    hard = lab.core.read_namespaced_resource_quota("team-quota", TEAM_A).spec.hard
    assert hard == {"requests.cpu": "8", "requests.memory": "32Gi", "requests.storage": "500Gi",
                    "requests.nvidia.com/gpu": "2", "requests.nvidia.com/gpu.shared": "0",
                    # DRA: the device classes tenancy_gpu_device_classes covers, 0 for a team that lists none.
                    "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "0",
                    "mig.nvidia.com.deviceclass.resource.k8s.io/devices": "0",
                    "services.nodeports": "0", "services.loadbalancers": "0"}
    policies = client.NetworkingV1Api(lab.api_client).list_namespaced_network_policy(TEAM_A).items
    assert sorted(p.metadata.name for p in policies) == ["allow-dns", "allow-monitoring-scrape",
                                                         "allow-same-namespace", "default-deny"]
    default_deny = next(p for p in policies if p.metadata.name == "default-deny").spec
    assert default_deny.pod_selector.match_labels is None and default_deny.policy_types == ["Ingress", "Egress"]
    limits = lab.core.read_namespaced_limit_range("team-defaults", TEAM_A).spec.limits[0]
    assert limits.default_request == {"cpu": "100m", "memory": "256Mi"}


def test_pod_security_rejects_privileged_and_hostpath_pods(lab: Lab, applied):
    # Everything else restricted asks for, but privileged (allowPrivilegeEscalation: false would be invalid with it).
    security = {**{k: v for k, v in RESTRICTED.items() if k != "allowPrivilegeEscalation"}, "privileged": True}
    privileged = refusal(lab, TEAM_A, pod("priv", security=security))
    assert 'violates PodSecurity "restricted:v1.37"' in privileged and 'privileged (container "main"' in privileged
    host = refusal(lab, TEAM_A, pod("host", volumes=[{"name": "host", "hostPath": {"path": "/var/lib"}}]))
    assert 'violates PodSecurity "restricted:v1.37"' in host and 'restricted volume type "hostPath"' in host
    root = refusal(lab, TEAM_A, pod("root", security={"runAsUser": 0}))
    assert "allowPrivilegeEscalation != false" in root and "runAsNonRoot != true" in root
    lab.core.create_namespaced_pod(TEAM_A, pod("compliant", gpus=1), dry_run="All")


def test_gpu_quota_rejects_a_pod_over_it(lab: Lab, applied):
    message = refusal(lab, TEAM_A, pod("greedy", gpus=3))
    assert "exceeded quota: team-quota" in message and "requests.nvidia.com/gpu=2" in message, message
    shared = refusal(lab, TEAM_A, {"metadata": {"name": "shared"}, "spec": {"containers": [{
        "name": "main", "image": "x", "securityContext": RESTRICTED,
        "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}]}})
    assert "exceeded quota: team-quota" in shared and "requests.nvidia.com/gpu.shared=0" in shared, shared
    lab.core.create_namespaced_pod(TEAM_A, pod("fits", gpus=2), dry_run="All")


def test_quota_keeps_team_services_inside_the_cluster(lab: Lab, applied):
    ports = [{"port": 8080, "protocol": "TCP"}]
    with pytest.raises(ApiException) as refused:
        lab.core.create_namespaced_service(TEAM_A, {"metadata": {"name": "exposed"},
                                                    "spec": {"type": "NodePort", "ports": ports}}, dry_run="All")
    message = json.loads(refused.value.body)["message"]
    assert "exceeded quota: team-quota" in message and "services.nodeports=0" in message, message
    lab.core.create_namespaced_service(TEAM_A, {"metadata": {"name": "internal"}, "spec": {"ports": ports}},
                                       dry_run="All")


def allowed(lab: Lab, user: str, verb: str, resource: str, namespace: str, *, group: str = "",
            subresource: str = "", groups: list[str] | None = None) -> bool:
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": user, "groups": groups or [], "resourceAttributes": {
                  "namespace": namespace, "verb": verb, "group": group, "resource": resource,
                  "subresource": subresource}}}
    return client.AuthorizationV1Api(lab.api_client).create_subject_access_review(review).status.allowed


# (who, verb, resource, API group, subresource, namespace, allowed); None namespace = team A's.
SYSTEM = ["nvidia-device-plugin", "gpu-monitoring", "kube-system"]
MATRIX = [
    ("alice", "create", "pods", "", "", "A", True),
    ("alice", "create", "jobs", "batch", "", "A", True),
    ("alice", "delete", "deployments", "apps", "", "A", True),
    ("alice", "get", "pods", "", "log", "A", True),
    ("alice", "create", "pods", "", "exec", "A", True),
    ("alice", "create", "persistentvolumeclaims", "", "", "A", True),
    ("alice", "get", "secrets", "", "", "A", True),
    # DRA: members ask for GPUs through claims (the quota's deviceclass keys limit them), never set an allocation.
    ("alice", "create", "resourceclaims", "resource.k8s.io", "", "A", True),
    ("alice", "create", "resourceclaimtemplates", "resource.k8s.io", "", "A", True),
    ("alice", "patch", "resourceclaims", "resource.k8s.io", "status", "A", False),
    ("alice", "create", "resourceclaims", "resource.k8s.io", "", "B", False),
    ("alice", "create", "pods", "", "", "B", False),
    ("alice", "list", "pods", "", "", "B", False),
    *[("alice", verb, "secrets", "", "", ns, False) for ns in SYSTEM for verb in ("get", "list")],
    ("alice", "update", "resourcequotas", "", "", "A", False),
    ("alice", "patch", "resourcequotas", "", "", "A", False),
    ("alice", "delete", "resourcequotas", "", "", "A", False),
    ("alice", "get", "resourcequotas", "", "", "A", True),
    ("alice", "patch", "limitranges", "", "", "A", False),
    ("alice", "delete", "networkpolicies", "networking.k8s.io", "", "A", False),
    ("alice", "create", "roles", "rbac.authorization.k8s.io", "", "A", False),
    ("alice", "create", "rolebindings", "rbac.authorization.k8s.io", "", "A", False),
    ("alice", "patch", "namespaces", "", "", "", False),
    ("group", "create", "pods", "", "", "A", True),
    ("bob", "create", "pods", "", "", "B", True),
    ("bob", "create", "pods", "", "", "A", False),
    ("victor", "get", "pods", "", "", "A", True),
    ("victor", "list", "jobs", "batch", "", "A", True),
    ("victor", "get", "pods", "", "log", "A", True),
    ("victor", "list", "resourceclaims", "resource.k8s.io", "", "A", True),
    ("victor", "create", "resourceclaims", "resource.k8s.io", "", "A", False),
    *[("victor", "create", resource, group, "", "A", False) for resource, group in
      (("pods", ""), ("jobs", "batch"), ("deployments", "apps"), ("configmaps", ""), ("services", ""),
       ("persistentvolumeclaims", ""))],
    ("victor", "create", "pods", "", "exec", "A", False),
    ("victor", "delete", "pods", "", "", "A", False),
    ("victor", "get", "secrets", "", "", "A", False),
    ("victor", "list", "pods", "", "", "B", False),
]


@pytest.mark.parametrize(("who", "verb", "resource", "group", "subresource", "where", "expected"), MATRIX,
                         ids=[f"{m[0]}-{m[1]}-{m[2]}{'/' + m[4] if m[4] else ''}-{m[5] or 'cluster'}" for m in MATRIX])
def test_subject_access_review_matrix(lab: Lab, applied, who, verb, resource, group, subresource, where, expected):
    namespace = {"A": TEAM_A, "B": TEAM_B, "": ""}.get(where, where)
    user, groups = {"alice": (ALICE, []), "bob": (BOB, []), "victor": (VICTOR, []),
                    "group": (f"carol-{SUFFIX}", [GROUP_A])}[who]
    assert allowed(lab, user, verb, resource, namespace, group=group, subresource=subresource,
                   groups=groups) is expected


def test_node_pool_policy_requires_the_pool(lab: Lab, applied):
    message = refusal(lab, TEAM_B, pod("anywhere", gpus=1))
    assert f"must select node pool nvidia.com/gpu.product={H100}" in message, message
    refusal(lab, TEAM_B, pod("a100", gpus=1, node_selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}))
    lab.core.create_namespaced_pod(TEAM_B, pod("h100", gpus=1, node_selector={"nvidia.com/gpu.product": H100}),
                                   dry_run="All")
    affinity = pod("aff", gpus=1)
    affinity["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100]}]}]}}}
    lab.core.create_namespaced_pod(TEAM_B, affinity, dry_run="All")
    # Team A has no pool: the policy leaves it alone.
    lab.core.create_namespaced_pod(TEAM_A, pod("free", gpus=1), dry_run="All")


def test_second_run_and_check_mode_change_nothing(lab: Lab, applied, tmp_path: Path):
    for mode in ((), ("--check",)):
        rc, output = apply(lab, tmp_path, teams(), *mode)
        assert rc == 0 and recap_changed(output) == 0, output[-3000:]


def test_check_mode_predicts_a_new_team_and_the_real_run_matches(lab: Lab, applied, tmp_path: Path):
    new = f"tc-{SUFFIX}"
    rc, output = apply(lab, tmp_path, teams({"name": new}), "--check")
    assert rc == 0 and recap_changed(output) == 2, output[-3000:]  # the namespace, and the prediction of its objects
    assert f"(predicted) would create in the new namespace {new}: role-member" in output
    assert not namespace_exists(lab, new)
    try:  # the real run changes what check mode predicted: the namespace and the objects in it
        rc, output = apply(lab, tmp_path, teams({"name": new}))
        assert rc == 0 and recap_changed(output) == 2, output[-3000:]
        assert namespace_exists(lab, new)
        assert lab.core.read_namespaced_resource_quota("team-quota", new).spec.hard["requests.cpu"] == "16"
    finally:
        delete_namespaces(lab, [new])


def test_a_team_removed_from_the_list_keeps_its_namespace(lab: Lab, applied, tmp_path: Path):
    rc, output = apply(lab, tmp_path, [teams()[1]])
    assert rc == 0 and recap_changed(output) == 0, output[-3000:]
    kept = re.search(r"Kept, not in tenancy_teams: ([^(]*)\(", " ".join(output.split()))
    assert kept and TEAM_A in kept.group(1).replace(",", " ").split(), output[-3000:]
    assert namespace_exists(lab, TEAM_A)
    assert lab.core.read_namespaced_resource_quota("team-quota", TEAM_A).spec.hard["requests.nvidia.com/gpu"] == "2"


def test_state_absent_refuses_a_namespace_with_data_unless_forced(lab: Lab, applied, tmp_path: Path):
    doomed = f"td-{SUFFIX}"
    try:
        rc, output = apply(lab, tmp_path, [{"name": doomed}])
        assert rc == 0, output[-3000:]
        lab.core.create_namespaced_persistent_volume_claim(doomed, {
            "metadata": {"name": "datasets"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
        rc, output = apply(lab, tmp_path, [{"name": doomed, "state": "absent"}])
        assert rc != 0, output[-3000:]
        assert (f"tenancy_teams entry '{doomed}' has state=absent and force=False, but its namespace holds "
                "persistent volume claims datasets") in output.replace("\n", " ").replace("  ", " ")
        assert namespace_exists(lab, doomed)
        rc, output = apply(lab, tmp_path, [{"name": doomed, "state": "absent", "force": True}])
        assert rc == 0 and recap_changed(output) == 1, output[-3000:]
        assert not namespace_exists(lab, doomed)
        rc, output = apply(lab, tmp_path, [{"name": doomed, "state": "absent", "force": True}])
        assert rc == 0 and recap_changed(output) == 0, output[-3000:]
    finally:
        delete_namespaces(lab, [doomed])


def test_state_absent_never_deletes_a_namespace_the_role_does_not_manage(lab: Lab, namespace, tmp_path: Path):
    foreign = namespace()
    rc, output = apply(lab, tmp_path, [{"name": foreign, "state": "absent", "force": True}])
    assert rc != 0 and f"tenancy_teams names {foreign}: a namespace of that name exists without the labels" in \
        output.replace("\n", " "), output[-3000:]
    assert namespace_exists(lab, foreign)


@pytest.mark.parametrize(("bad", "expected"), [
    ({"name": "Bad_Name"}, "tenancy_teams[1].name='Bad_Name'; allowed: a DNS-1123 label"),
    ({"name": "x", "gpus": {"nvidia.com/gpu": -1}}, "tenancy_teams[1].gpus['nvidia.com/gpu']=-1; allowed"),
    ({"name": "x", "cpu": "-4"}, "tenancy_teams[1].cpu='-4'; allowed: a quantity >= 0"),
    ({"name": "x", "gpus": {"nvidia.com/tpu": 1}}, "gpus key 'nvidia.com/tpu' is not a GPU resource"),
    ({"name": "x", "members": {"users": ["eve"]}, "viewers": {"users": ["eve"]}}, "user 'eve' both member and viewer"),
])
def test_bad_input_fails_before_any_change(lab: Lab, tmp_path: Path, bad, expected):
    fresh = f"tf-{uuid.uuid4().hex[:6]}"
    rc, output = apply(lab, tmp_path, [{"name": fresh}, bad])
    assert rc != 0, output[-3000:]
    assert expected in output, output[-3000:]
    assert not namespace_exists(lab, fresh)


def test_quoted_boolean_fails_before_any_change(lab: Lab, tmp_path: Path):
    """A quoted "false" would read as true in the member Role's template and give members exec: refused."""
    fresh = f"tf-{uuid.uuid4().hex[:6]}"
    rc, output = apply(lab, tmp_path, [{"name": fresh}], "-e", '{"tenancy_member_exec": "false"}')
    assert rc != 0 and 'tenancy_member_exec="false" is not a boolean (str)' in " ".join(output.split()), \
        output[-3000:]
    assert not namespace_exists(lab, fresh)


def test_unknown_keys_and_duplicates_fail_before_any_change(lab: Lab, tmp_path: Path):
    fresh = f"tf-{uuid.uuid4().hex[:6]}"
    rc, output = apply(lab, tmp_path, [{"name": fresh}, {"name": fresh}])
    assert rc != 0 and f"tenancy_teams[1].name='{fresh}' repeats tenancy_teams[0]" in output, output[-3000:]
    rc, output = apply(lab, tmp_path, [{"name": fresh, "quota": {"gpu": 1}}])
    # The role's argument spec refuses the unknown key first (before preflight), naming it.
    assert rc != 0 and "quota" in output, output[-3000:]
    assert not namespace_exists(lab, fresh)


def test_cluster_playbook_leaves_system_namespaces_at_their_own_levels(lab: Lab):
    """cluster.yml runs tenancy after the device plugin and the exporter: their namespaces keep `privileged` (they
    mount hostPath), set by their own roles, and tenancy neither labels nor owns them."""
    rc, output = run_playbook(lab, "cluster.yml", "-i", LAB_INVENTORY, "-e", json.dumps({"tenancy_teams": []}))
    assert rc == 0, output[-3000:]
    for name in ("nvidia-device-plugin", "gpu-monitoring"):
        labels = lab.core.read_namespace(name).metadata.labels
        assert labels["pod-security.kubernetes.io/enforce"] == "privileged", (name, labels)
        assert "gpu-cluster.dev/team" not in labels, (name, labels)
