"""runner/gpu_ops_drift.py: classification, redaction, policy, decisions, report and metrics as pure functions, and
real ansible-runner runs of a small stand-in for the drift playbook (a role named like the CUDA role, on localhost):
detect, report, repair with a re-check, approve and apply, the lock."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from conftest import REPO_ROOT, load_source, promtool_path

load_source("gpu_ops_run", REPO_ROOT / "runner" / "gpu_ops_run.py")
drift = load_source("gpu_ops_drift", REPO_ROOT / "runner" / "gpu_ops_drift.py")
SCHEMA = json.loads((REPO_ROOT / "docs" / "drift-report.schema.json").read_text())
TODAY = dt.date(2026, 12, 4)


def event(kind: str, **data) -> dict:
    return {"event": kind, "event_data": data}


def k8s_ok(host: str, task: str, uuid: str, result: dict) -> dict:
    return event("runner_on_ok", host=host, task=task, task_uuid=uuid, resolved_action="kubernetes.core.k8s",
                 res=result)


# --- classes -----------------------------------------------------------------------------------------------------

def test_each_role_has_a_class_and_tenancy_splits_by_kind():
    assert drift.class_of("nvidia_driver") == "driver"
    assert drift.class_of("grafana") == "monitoring" and drift.class_of("dcgm_exporter") == "monitoring"
    assert drift.class_of("tenancy", "ResourceQuota") == "quota"
    assert drift.class_of("tenancy", "RoleBinding") == "tenancy_rbac"
    assert drift.class_of("tenancy", "NetworkPolicy") == "network_policy"
    assert drift.class_of("tenancy", "Namespace") == "tenancy_namespace"
    assert drift.class_of("gpu_validation") == "other" and drift.class_of("") == "other"
    assert drift.class_of("gpu_health") == "gpu_health"
    assert drift.class_tags(["quota", "monitoring"]) == ["dcgm_exporter", "grafana", "prometheus", "tenancy"]
    assert drift.classes_of_tags(["tenancy"]) == ["tenancy_namespace", "tenancy_rbac", "quota", "network_policy"]


def test_every_class_role_is_a_role_of_the_collection_tagged_in_the_playbooks():
    roles = {path.name for path in (REPO_ROOT / "roles").iterdir()}
    for name in drift.REPAIRABLE:
        for role in drift.class_tags([name]):
            assert role in roles, (name, role)
    tagged = (REPO_ROOT / "playbooks" / "nodes.yml").read_text()
    for role in ("nvidia_driver", "cuda_toolkit", "nvidia_container_toolkit"):
        assert f"tags: [{role}]" in tagged
    # The health check's plays carry its tag (a gpu_health repair runs them by it), and drift.yml imports them.
    assert (REPO_ROOT / "playbooks" / "health.yml").read_text().count("tags: [gpu_health]") == 2
    assert "gpu_ops.cluster.health" in (REPO_ROOT / "playbooks" / "drift.yml").read_text()


# --- redaction and diffs -----------------------------------------------------------------------------------------

def test_secrets_are_redacted_in_objects_and_by_key_name():
    secret = {"kind": "Secret", "metadata": {"name": "grafana-admin"}, "data": {"password": "c2VjcmV0", "user": "YQ=="},
              "stringData": {"x": "plain"}}
    redacted = drift.redact(secret)
    assert redacted["data"] == {"password": drift.REDACTED, "user": drift.REDACTED}
    assert redacted["stringData"] == {"x": drift.REDACTED} and redacted["metadata"]["name"] == "grafana-admin"
    nested = drift.redact({"env": [{"name": "ADMIN_PASSWORD", "admin_password": "hunter2", "api_token": "t"}]})
    assert nested == {"env": [{"name": "ADMIN_PASSWORD", "admin_password": drift.REDACTED, "api_token": drift.REDACTED}]}
    assert "c2VjcmV0" not in json.dumps(drift.diff_of({"diff": {"before": secret, "after": {**secret, "data": {
        "password": "bmV3"}}}}, "Secret"))


def test_object_diffs_name_the_changed_fields():
    before = {"spec": {"hard": {"requests.nvidia.com/gpu": "8"}}, "metadata": {"labels": {"a": "1"}}}
    after = {"spec": {"hard": {"requests.nvidia.com/gpu": "14"}}, "metadata": {"labels": {"a": "1", "b": "2"}}}
    assert drift.diff_of({"diff": {"before": before, "after": after}}) == [
        {"path": "metadata.labels.b", "before": None, "after": "2"},
        {"path": "spec.hard.requests.nvidia.com/gpu", "before": "8", "after": "14"}]
    text = drift.diff_of({"diff": [{"before": "a\n", "after": "b\n", "after_header": "/etc/x.toml"}]})
    assert text == [{"path": "/etc/x.toml", "before": "a\n", "after": "b\n"}]
    assert drift.diff_of({"diff": {"prepared": "Inst nvidia-smi"}}) == [{"prepared": "Inst nvidia-smi"}]
    assert drift.diff_of({}) is None


# --- events -------------------------------------------------------------------------------------------------------

def test_events_become_items_with_the_importing_role_and_each_object_of_a_multi_document_apply():
    events = [
        event("playbook_on_play_start", name="Tenancy"),
        event("playbook_on_task_start", task="Validating arguments against arg spec main", role="gpu_ops.cluster.tenancy",
              task_uuid="t0"),
        event("playbook_on_task_start", task="Apply each team's objects", role="gpu_ops.cluster.tenancy", task_uuid="t1"),
        k8s_ok("localhost", "Apply each team's objects", "t1", {"changed": True, "results": [
            {"changed": True, "result": {"results": [
                {"changed": False, "result": {"kind": "Role", "metadata": {"namespace": "nlp", "name": "member"}}},
                {"changed": True, "diff": {"before": {"spec": {"hard": {"g": "8"}}}, "after": {"spec": {"hard": {"g": "9"}}}},
                 "result": {"kind": "ResourceQuota", "metadata": {"namespace": "nlp", "name": "team-quota"}}}]}},
            {"changed": False, "result": {"results": []}}]}),
        event("playbook_on_play_start", name="GPU stack"),
        event("playbook_on_task_start", task="Validating arguments against arg spec main",
              role="gpu_ops.cluster.nvidia_device_plugin", task_uuid="d0"),
        # _common's tasks count for the role that imported them.
        event("playbook_on_task_start", task="Apply the namespaced objects", role="gpu_ops.cluster._common",
              task_uuid="d1"),
        k8s_ok("localhost", "Apply the namespaced objects", "d1", {"changed": True, "results": [
            {"changed": True, "__common_k8s_template": "daemonset", "result": {
                "kind": "DaemonSet", "metadata": {"namespace": "gpu-system", "name": "nvidia-device-plugin"}},
             "diff": {"before": {"spec": {"x": 1}}, "after": {"spec": {"x": 2}}}}]}),
        event("playbook_on_task_start", task="Install the toolkit", role="gpu_ops.cluster.nvidia_container_toolkit",
              task_uuid="n1"),
        event("runner_on_ok", host="gpu-0", task="Install the toolkit", task_uuid="n1",
              res={"changed": True, "invocation": {"module_args": {"name": ["nvidia-container-toolkit=1.20.2-*"]}}}),
        event("runner_on_skipped", host="gpu-0", task="Rebuild initramfs", task_uuid="n2", role="gpu_ops.cluster.nvidia_container_toolkit",
              res={"skipped": True, "msg": "Command would have run if not in check mode"}),
        event("runner_on_ok", host="gpu-0", task="Probe", task_uuid="n3", role="gpu_ops.cluster.nvidia_container_toolkit", res={"changed": False}),
        event("runner_on_ok", host="gpu-0", task="Write the admin password", task_uuid="n4", role="gpu_ops.cluster.nvidia_container_toolkit",
              res={"changed": True, "censored": "the output has been hidden due to the fact that 'no_log: true'"}),
        event("runner_on_unreachable", host="gpu-1", task="Gathering Facts", res={"msg": "podman: no such container"}),
    ]
    found = drift.items_from_events(events)
    assert [(i.host, i.role, i.drift_class, i.resource) for i in found.items] == [
        ("localhost", "tenancy", "quota", "ResourceQuota/nlp/team-quota"),
        ("localhost", "nvidia_device_plugin", "device_plugin", "DaemonSet/gpu-system/nvidia-device-plugin"),
        ("gpu-0", "nvidia_container_toolkit", "container_runtime", "nvidia-container-toolkit=1.20.2-*"),
        ("gpu-0", "nvidia_container_toolkit", "container_runtime", ""),
    ]
    assert found.items[0].diff == [{"path": "spec.hard.g", "before": "8", "after": "9"}]
    assert found.items[3].diff == drift.HIDDEN
    assert found.unverifiable == [{"host": "gpu-0", "role": "nvidia_container_toolkit", "task": "Rebuild initramfs",
                                   "reason": "Command would have run if not in check mode"}]
    assert found.unreachable == {"gpu-1": "podman: no such container"}
    assert found.hosts == ["gpu-0", "gpu-1", "localhost"]


# --- policy and decisions -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("variables", "message"), [
    ({"gpu_drift_policy": ["driver"]}, "gpu_drift_policy=['driver']; allowed: a mapping"),
    ({"gpu_drift_policy": {"drivers": "repair"}}, "gpu_drift_policy.drivers is not a drift class; allowed: driver,"),
    ({"gpu_drift_policy": {"quota": "fix"}}, "gpu_drift_policy.quota='fix'; allowed: report, repair, approve"),
    ({"gpu_drift_repair_serial": 0}, "gpu_drift_repair_serial=0; allowed: a positive count"),
    ({"gpu_drift_repair_serial": "150%"}, "gpu_drift_repair_serial='150%'"),
    ({"gpu_drift_repair_max_fail_percentage": "10"}, "gpu_drift_repair_max_fail_percentage='10'; allowed: an integer"),
    ({"gpu_drift_opt_out": [{"host": "gpu-0"}]}, "gpu_drift_opt_out[0].until is missing"),
    ({"gpu_drift_opt_out": [{"host": "gpu-0", "until": "next week"}]},
     "gpu_drift_opt_out[0].until='next week'; allowed: a date YYYY-MM-DD"),
    ({"gpu_drift_opt_out": [{"until": "2027-01-01"}]}, "gpu_drift_opt_out[0]={'until': '2027-01-01'}; allowed: exactly one"),
    ({"gpu_drift_opt_out": [{"host": "a", "resource": "b", "until": "2027-01-01"}]}, "exactly one of host"),
    ({"gpu_drift_opt_out": [{"host": "a", "until": "2027-01-01", "why": "x"}]},
     "gpu_drift_opt_out[0].why is not a known key"),
])
def test_bad_drift_settings_are_refused_naming_the_path(variables, message):
    with pytest.raises(drift.DriftInputError) as refused:
        drift.parse_policy(variables, TODAY)
    assert message in str(refused.value)


def test_policy_defaults_to_report_and_expired_opt_outs_are_noted():
    policy, notes = drift.parse_policy({"gpu_drift_policy": {"quota": "repair"}, "gpu_drift_opt_out": [
        {"host": "gpu-h100-*", "until": "2026-12-31", "reason": "burn-in"},
        {"resource": "DaemonSet/*/dcgm-exporter", "until": "2026-12-01"}]}, TODAY)
    assert policy.action("quota") == "repair" and policy.action("driver") == "report"
    assert policy.action("other") == "report"
    assert [o["host"] for o in policy.opt_outs] == ["gpu-h100-*"]
    assert notes == ["gpu_drift_opt_out[1] (DaemonSet/*/dcgm-exporter) expired on 2026-12-01: checked and handled as usual"]


def test_settings_the_run_would_not_use_are_noted():
    """Issue 35: a policy in a group the runner does not read, an opt-out naming a group, a Kind in lower case."""
    policy, _ = drift.parse_policy({"gpu_drift_opt_out": [
        {"host": "gpu_nodes", "until": "2026-12-31"}, {"host": "gpu-h100-*", "until": "2026-12-31"},
        {"host": "gpu-v100-*", "until": "2026-12-31"},
        {"resource": "configmap/gpu-system/*", "until": "2026-12-31"},
        {"resource": "ConfigMap/gpu-system/*", "until": "2026-12-31"}]}, TODAY)
    control = {"gpu_drift_policy": {"quota": "repair"}}
    hostvars = {"localhost": control, "gpu-h100-0": {"gpu_drift_policy": {"driver": "repair"}},
                "gpu-h100-1": {"gpu_drift_policy": {"quota": "repair"}}}
    notes = drift.settings_notes(policy, control, ["localhost"], hostvars, ["all", "gpu_nodes", "cluster_control"])
    assert notes == [
        "gpu_drift_policy is set for gpu-h100-0 with another value than the runner reads (localhost's): the runner "
        "ignores it; put it in group_vars of all or of cluster_control",
        "gpu_drift_opt_out[0].host='gpu_nodes' matches no host of the inventory (gpu_nodes is a group: host takes "
        "host names or patterns such as gpu-h100-*)",
        "gpu_drift_opt_out[2].host='gpu-v100-*' matches no host of the inventory",
        "gpu_drift_opt_out[3].resource='configmap/gpu-system/*' matches nothing: a resource is Kind/namespace/name "
        "with the Kind as the API spells it (ConfigMap, not configmap)"]


def item(host: str, drift_class: str, resource: str = "r") -> "drift.DriftItem":
    return drift.DriftItem(host=host, role=drift.class_tags([drift_class])[0], drift_class=drift_class, task="t",
                           action="a", resource=resource)


def test_decisions_follow_the_policy_opt_outs_and_hold_a_repair_that_would_change_another_class():
    policy, _ = drift.parse_policy({"gpu_drift_policy": {"quota": "repair", "cuda": "repair", "device_plugin": "approve"},
                                    "gpu_drift_opt_out": [{"host": "gpu-2", "until": "2027-01-01", "reason": "RMA"}]},
                                   TODAY)
    items = [item("localhost", "quota"), item("localhost", "tenancy_rbac"), item("gpu-0", "cuda"),
             item("gpu-2", "cuda"), item("localhost", "device_plugin")]
    drift.decide(items, policy)
    assert [i.decision for i in items] == ["held", "report", "repair", "opted_out", "approve"]
    assert "would also change tenancy_rbac" in items[0].reason and "RMA" in items[3].reason
    assert drift.repair_scope(items, ["localhost"]) == (["cuda_toolkit"], ["gpu-0"])
    # Without the RBAC drift the quota repair goes ahead, and cluster classes bring the control host.
    items = [item("localhost", "quota"), item("gpu-0", "cuda")]
    drift.decide(items, policy)
    assert [i.decision for i in items] == ["repair", "repair"]
    assert drift.repair_scope(items, ["localhost"]) == (["cuda_toolkit", "tenancy"], ["gpu-0", "localhost"])
    # The quarantine is made through the control host from the GPU nodes' verdicts: its repair reads them again,
    # except on a host opted out (no verdict: its node stays as it is).
    items = [item("localhost", "gpu_health")]
    items[0].reads = ["gpu-0", "gpu-1", "gpu-2"]
    drift.decide(items, policy)
    assert items[0].decision == "report" and items[0].reason == "default: report"
    policy, _ = drift.parse_policy({"gpu_drift_policy": {"gpu_health": "repair"},
                                    "gpu_drift_opt_out": [{"host": "gpu-2", "until": "2027-01-01"}]}, TODAY)
    drift.decide(items, policy)
    assert drift.repair_scope(items, ["localhost"]) == (["gpu_health"], ["gpu-0", "gpu-1", "localhost"])
    items = [item("gpu-0", "cuda")]
    drift.decide(items, policy, detect_only=True)
    assert items[0].decision == "report" and "detection only" in items[0].reason


# --- opt-out by annotation on the live object ---------------------------------------------------------------------

TEAM_TASK = "Apply each team's roles, bindings, quota, container defaults and network policies"


def live(kind: str, name: str, body: dict, annotations: dict | None = None) -> dict:
    """An object of team nlp as the API server returns it: bookkeeping, kubectl's annotation and its own."""
    return {"apiVersion": "v1", "kind": kind, "metadata": {
        "name": name, "namespace": "nlp", "uid": f"7d0c-{name}", "resourceVersion": "48213",
        "creationTimestamp": "2026-11-02T09:14:03Z", "managedFields": [{"manager": "kubectl-client-side-apply"}],
        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", **(annotations or {})}}, **body}


def applied(before: dict, body: dict) -> dict:
    """One object's result of kubernetes.core.k8s apply in check mode: the object the apply would make (what others
    set, such as annotations, stays) and the diff from the live object."""
    after = {**before, **body}
    return {"changed": True, "method": "apply", "result": after, "diff": {"before": before, "after": after}}


def team_events(*objects: dict) -> list:
    """The tenancy role's apply of team nlp's objects (one task for all teams: a multi-document definition)."""
    return [
        event("playbook_on_play_start", name="Tenancy"),
        event("playbook_on_task_start", task=TEAM_TASK, role="gpu_ops.cluster.tenancy", task_uuid="t1"),
        k8s_ok("localhost", TEAM_TASK, "t1", {"changed": True, "result": {"results": list(objects)}}),
    ]


QUOTA = {"spec": {"hard": {"requests.nvidia.com/gpu": "8"}}}
LIMITS = {"spec": {"limits": [{"type": "Container", "default": {"cpu": "2"}}]}}
DENY = {"spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
RULES = {"rules": [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list"]}]}


def test_an_object_annotated_until_a_date_is_opted_out_like_the_inventory_and_bad_dates_are_noted():
    quota = live("ResourceQuota", "team-quota", {"spec": {"hard": {"requests.nvidia.com/gpu": "12"}}}, {
        drift.OPT_OUT_UNTIL: "2026-12-31", drift.OPT_OUT_REASON: "4 GPUs lent by vision for the offsite"})
    limits = live("LimitRange", "container-defaults", {"spec": {"limits": []}}, {drift.OPT_OUT_UNTIL: "next friday"})
    deny = live("NetworkPolicy", "default-deny", {"spec": {"podSelector": {}}}, {drift.OPT_OUT_UNTIL: "2026-12-01"})
    role = live("Role", "member", {"rules": []}, {drift.OPT_OUT_UNTIL: "2026-12-04"})  # today: still on (inclusive)
    found = drift.items_from_events(team_events(
        applied(quota, QUOTA), applied(limits, LIMITS), applied(deny, DENY), applied(role, RULES)))
    assert [i.resource for i in found.items] == ["ResourceQuota/nlp/team-quota", "LimitRange/nlp/container-defaults",
                                                 "NetworkPolicy/nlp/default-deny", "Role/nlp/member"]
    # The annotation is the object's state, not drift: the diff names only what the role would change.
    assert found.items[0].diff == [{"path": "spec.hard.requests.nvidia.com/gpu", "before": "12", "after": "8"}]
    assert "opt_out_annotations" not in found.items[0].as_dict()

    entries, notes = drift.annotation_opt_outs(found.items, TODAY)
    assert notes == [
        "gpu-ops.dev/drift-opt-out-until annotation on LimitRange/nlp/container-defaults: 'next friday' is not a date "
        "YYYY-MM-DD; ignored",
        "gpu-ops.dev/drift-opt-out-until annotation on NetworkPolicy/nlp/default-deny expired on 2026-12-01: checked "
        "and handled as usual"]
    assert [(e["resource"], e["until"], e["reason"]) for e in entries] == [
        ("ResourceQuota/nlp/team-quota", "2026-12-31", "4 GPUs lent by vision for the offsite"),
        ("Role/nlp/member", "2026-12-04", "")]
    policy, _ = drift.parse_policy({"gpu_drift_policy": {"network_policy": "approve"}}, TODAY)
    policy = dataclasses.replace(policy, opt_outs=policy.opt_outs + entries)
    drift.decide(found.items, policy)
    assert [(i.decision, i.result) for i in found.items] == [("opted_out", "left alone"), ("report", "not repaired"),
                                                             ("approve", "not repaired"), ("opted_out", "left alone")]
    assert found.items[0].reason == ("opted out by annotation gpu-ops.dev/drift-opt-out-until (ResourceQuota/nlp/"
                                     "team-quota) until 2026-12-31: 4 GPUs lent by vision for the offsite")
    assert found.items[3].reason.endswith("until 2026-12-04")
    # The next day the Role's opt-out has expired too.
    _, later = drift.annotation_opt_outs(found.items, TODAY + dt.timedelta(days=1))
    assert "gpu-ops.dev/drift-opt-out-until annotation on Role/nlp/member expired on 2026-12-04: checked and handled " \
           "as usual" in later


@pytest.mark.parametrize("value", ["2026-02-30", "20261231", "2026-W52-4", "2026-12-31T00:00:00Z", " 2026-12-31", ""])
def test_an_annotation_that_is_not_a_plain_date_is_ignored(value):
    (found,) = drift.items_from_events(team_events(applied(
        live("ResourceQuota", "team-quota", {"spec": {"hard": {}}}, {drift.OPT_OUT_UNTIL: value}), QUOTA))).items
    entries, notes = drift.annotation_opt_outs([found], TODAY)
    assert entries == [] and notes == [f"gpu-ops.dev/drift-opt-out-until annotation on ResourceQuota/nlp/team-quota: "
                                       f"{value!r} is not a date YYYY-MM-DD; ignored"]


def test_only_the_live_object_counts_and_other_annotations_are_not_read():
    live_quota = live("ResourceQuota", "team-quota", {"spec": {"hard": {}}}, {"team.example/owner": "bob"})
    after = {**live_quota, **QUOTA, "metadata": {**live_quota["metadata"], "annotations": {
        drift.OPT_OUT_UNTIL: "2026-12-31"}}}
    (found,) = drift.items_from_events(team_events(
        {"changed": True, "result": after, "diff": {"before": live_quota, "after": after}})).items
    assert found.opt_out_annotations == {}
    # A new object (nothing live yet) has no annotations either.
    (new,) = drift.items_from_events(team_events(
        {"changed": True, "result": after, "diff": {"before": {}, "after": after}})).items
    assert drift.annotation_opt_outs([found, new], TODAY) == ([], [])


def test_a_repair_is_held_when_its_role_would_also_change_an_opted_out_item_on_that_host():
    policy, _ = drift.parse_policy({"gpu_drift_policy": {"quota": "repair", "cuda": "repair"}, "gpu_drift_opt_out": [
        {"resource": "ResourceQuota/nlp/*", "until": "2026-12-31", "reason": "offsite"},
        {"host": "gpu-2", "until": "2026-12-31"}]}, TODAY)
    items = [item("localhost", "quota", "ResourceQuota/nlp/team-quota"),
             item("localhost", "quota", "ResourceQuota/vision/team-quota"),
             item("gpu-0", "cuda"), item("gpu-2", "cuda")]
    drift.decide(items, policy)
    assert [i.decision for i in items] == ["opted_out", "held", "repair", "opted_out"]
    assert items[0].reason == "opted out by gpu_drift_opt_out[0] (ResourceQuota/nlp/*) until 2026-12-31: offsite"
    assert items[1].reason == ("quota's repair runs the tenancy role on localhost, which would also change "
                               "ResourceQuota/nlp/team-quota, opted out")
    # gpu-2's opt-out does not hold gpu-0's repair: the repair run is limited to gpu-0.
    assert drift.repair_scope(items, ["localhost"]) == (["cuda_toolkit"], ["gpu-0"])


def test_check_leaves_an_annotated_object_alone_and_a_bad_annotation_does_not_fail_the_run(tmp_path, monkeypatch):
    """check_command with the playbook run replaced by its recorded events (no cluster here): the annotation's opt-out
    reaches the report, its notes and the exit code like an inventory opt-out."""
    events = team_events(
        applied(live("ResourceQuota", "team-quota", {"spec": {"hard": {"requests.nvidia.com/gpu": "12"}}}, {
            drift.OPT_OUT_UNTIL: "2999-12-31", drift.OPT_OUT_REASON: "offsite"}), QUOTA),
        applied(live("LimitRange", "container-defaults", {"spec": {"limits": []}}, {drift.OPT_OUT_UNTIL: "31.12.2999"}),
                LIMITS))
    runs = []

    def recorded_run(request, run_dir, name, **_):
        runs.append(name)
        artifact_dir = run_dir / "artifacts" / name
        (artifact_dir / "job_events").mkdir(parents=True)
        for counter, entry in enumerate(events, 1):
            (artifact_dir / "job_events" / f"{counter}-e.json").write_text(json.dumps({**entry, "counter": counter}))
        outcome = drift.gpu_ops_run.RunOutcome(rc=0, status="successful", ident=name, artifact_dir=artifact_dir,
                                               summary={})
        return outcome, run_dir / "artifacts" / f"skips-{name}.jsonl"

    monkeypatch.setattr(drift, "_run", recorded_run)
    monkeypatch.setattr(drift, "inventory_variables", lambda inventories, cwd: (
        {"gpu_drift_policy": {"quota": "repair"}}, ["localhost"], {}, ["all"]))
    (tmp_path / "hosts.yml").write_text("all: {}\n")
    request = drift.DriftRequest(inventories=("hosts.yml",), reports="reports", cwd=str(tmp_path))
    assert drift.check_command(request, io.StringIO()) == drift.EXIT_DRIFT
    report = json.loads((tmp_path / "reports" / "latest.json").read_text())
    jsonschema.validate(report, SCHEMA)
    assert runs == ["check"]  # the LimitRange's repair is held: the tenancy role would change the opted-out quota
    assert [(i["resource"], i["decision"]) for i in report["items"]] == [
        ("ResourceQuota/nlp/team-quota", "opted_out"), ("LimitRange/nlp/container-defaults", "held")]
    assert report["opt_outs"] == [{"host": None, "resource": "ResourceQuota/nlp/team-quota", "until": "2999-12-31",
                                   "reason": "offsite", "source": "annotation gpu-ops.dev/drift-opt-out-until"}]
    assert report["notes"] == ["gpu-ops.dev/drift-opt-out-until annotation on LimitRange/nlp/container-defaults: "
                               "'31.12.2999' is not a date YYYY-MM-DD; ignored"]


# --- report and metrics ---------------------------------------------------------------------------------------------

def sample_report(result: str = "drift") -> dict:
    check = drift.CheckResult(hosts=["gpu-0", "localhost"], unverifiable=[
        {"host": "gpu-0", "role": "nvidia_driver", "task": "Rebuild", "reason": "check mode"}])
    items = [item("gpu-0", "cuda", "/etc/profile.d/cuda.sh"), item("localhost", "quota", "ResourceQuota/nlp/q")]
    items[1].result = "repaired"
    policy, _ = drift.parse_policy({}, TODAY)
    start = dt.datetime(2026, 12, 4, 3, 0, 0, tzinfo=dt.timezone.utc)
    return drift.report_document(ident="20261204T030000Z-abc123", started=start,
                                 finished=start + dt.timedelta(seconds=42), inventories=["/inv"], playbook="p",
                                 check=check, items=items, result=result, notes=[], runs=[], policy=policy,
                                 detect_only=False, plan=None)


def test_the_report_validates_against_its_schema_and_a_broken_one_does_not():
    report = sample_report()
    jsonschema.validate(report, SCHEMA)
    assert report["counts"] == {"items": 2, "report": 2} and report["exit_code"] == 2
    broken = {**report, "result": "maybe"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCHEMA)
    assert "gpu-0" in drift.format_summary(report) and "1 task(s) check mode cannot verify" in drift.format_summary(report)


def test_metrics_parse_with_promtool_and_keep_the_last_success_over_a_failure(tmp_path):
    text = drift.metrics_text(sample_report(), None)
    assert 'gpu_drift_detected{class="cuda",host="gpu-0"} 1' in text
    assert 'gpu_drift_repaired{class="quota",host="localhost"} 1' in text
    assert 'gpu_drift_last_run_result{result="drift"} 1' in text and "gpu_drift_unverifiable_tasks{host=\"gpu-0\"} 1" in text
    checked = subprocess.run([str(promtool_path()), "check", "metrics"], input=text, capture_output=True, text=True,
                             check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    metrics = tmp_path / "gpu_drift.prom"
    drift.write_atomically(metrics, text)
    success = drift.previous_success(metrics)
    assert success == dt.datetime(2026, 12, 4, 3, 0, 42, tzinfo=dt.timezone.utc).timestamp()
    failed = drift.metrics_text(sample_report("failed"), success)
    assert f"gpu_drift_last_success_timestamp_seconds {success:.0f}" in failed
    assert list(tmp_path.iterdir()) == [metrics]  # no temporary file left beside it


def test_a_second_run_cannot_take_the_lock(tmp_path):
    with drift.RunLock(tmp_path / "drift.lock"):
        with pytest.raises(drift.Locked) as locked:
            with drift.RunLock(tmp_path / "drift.lock"):
                pass
    assert "another drift run holds" in str(locked.value) and "pid" in str(locked.value)
    with drift.RunLock(tmp_path / "drift.lock"):  # released
        pass


# --- real runs through ansible-runner -------------------------------------------------------------------------------

ROLE_TASKS = """\
- name: Write the CUDA profile
  ansible.builtin.copy:
    content: "{{ stand_in_content }}"
    dest: "{{ stand_in_file }}"
    mode: "0644"

- name: Write a secret beside it
  ansible.builtin.copy:
    content: "{{ stand_in_secret }}"
    dest: "{{ stand_in_file }}.secret"
    mode: "0600"
  no_log: true

- name: Rebuild something
  ansible.builtin.command: "true"
  changed_when: true
"""

PLAYBOOK = """\
- name: Stand-in for the drift playbook
  hosts: gpu_nodes
  gather_facts: false
  roles:
    - role: cuda_toolkit
      tags: [cuda_toolkit]
"""


@pytest.fixture()
def stand_in(tmp_path):
    """A role named cuda_toolkit (class cuda) that writes two files on localhost, a playbook, an inventory."""
    tasks = tmp_path / "roles" / "cuda_toolkit" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "main.yml").write_text(ROLE_TASKS)
    (tmp_path / "drift.yml").write_text(PLAYBOOK)
    target = tmp_path / "state" / "cuda.sh"
    target.parent.mkdir()

    def inventory(policy: dict) -> str:
        path = tmp_path / "inventory.yml"
        path.write_text(yaml.safe_dump({"all": {"vars": {
            "ansible_connection": "local", "ansible_python_interpreter": str(REPO_ROOT / ".venv" / "bin" / "python"),
            "stand_in_file": str(target), "stand_in_content": "export CUDA=12.8\n", "stand_in_secret": "hunter2-secret",
            **policy}, "children": {"gpu_nodes": {"hosts": {"localhost": {}}}, "cluster_control": {"hosts": {"localhost": {}}}}}}))
        return str(path)

    def run(command: str, policy: dict, *extra: str) -> tuple[int, str]:
        out = io.StringIO()
        argv = [command, *extra, "-i", inventory(policy), "--reports", str(tmp_path / "reports"),
                "--envvars", f"ANSIBLE_ROLES_PATH={tmp_path / 'roles'}"]
        request = drift.request_from_args(drift.build_parser().parse_args(argv), tmp_path)
        request = drift.DriftRequest(**{**request.__dict__, "playbook": str(tmp_path / "drift.yml")})
        if command == "apply":
            return drift.apply_command(request, Path(extra[0]), out), out.getvalue()
        return drift.check_command(request, out), out.getvalue()

    return {"run": run, "target": target, "reports": tmp_path / "reports"}


def latest(stand_in) -> dict:
    report = json.loads((stand_in["reports"] / "latest.json").read_text())
    jsonschema.validate(report, SCHEMA)
    return report


def test_drift_is_reported_and_nothing_changes_under_the_default_policy(stand_in):
    stand_in["target"].write_text("export CUDA=12.6\n")  # edited by hand
    rc, output = stand_in["run"]("check", {})
    assert rc == drift.EXIT_DRIFT, output
    report = latest(stand_in)
    (cuda, secret) = report["items"]
    assert cuda["class"] == "cuda" and cuda["resource"] == str(stand_in["target"]) and cuda["decision"] == "report"
    assert cuda["diff"][0]["before"] == "export CUDA=12.6\n" and cuda["diff"][0]["after"] == "export CUDA=12.8\n"
    assert secret["diff"] == drift.HIDDEN
    assert [u["task"] for u in report["unverifiable"]] == ["Rebuild something"]
    assert stand_in["target"].read_text() == "export CUDA=12.6\n"
    everything = "".join(p.read_text(errors="replace") for p in stand_in["reports"].rglob("*") if p.is_file()
                         and "artifacts" not in p.parts)
    assert "hunter2-secret" not in everything
    metrics = (stand_in["reports"] / "gpu_drift.prom").read_text()
    assert 'gpu_drift_detected{class="cuda",host="localhost"} 2' in metrics


def test_repair_changes_it_back_and_the_recheck_confirms(stand_in):
    stand_in["target"].write_text("export CUDA=12.6\n")
    rc, output = stand_in["run"]("check", {"gpu_drift_policy": {"cuda": "repair"}})
    assert rc == drift.EXIT_REPAIRED, output
    assert stand_in["target"].read_text() == "export CUDA=12.8\n"
    report = latest(stand_in)
    assert {i["result"] for i in report["items"]} == {"repaired"}
    assert [r["name"] for r in report["runs"]] == ["check", "repair", "recheck"]
    rc, output = stand_in["run"]("check", {"gpu_drift_policy": {"cuda": "repair"}})
    assert rc == drift.EXIT_IN_SYNC, output
    assert latest(stand_in)["result"] == "in_sync"


def test_approve_writes_a_plan_that_applies_only_after_the_explicit_step_and_rechecks_first(stand_in):
    stand_in["target"].write_text("export CUDA=12.6\n")
    policy = {"gpu_drift_policy": {"cuda": "approve"}}
    rc, output = stand_in["run"]("check", policy)
    assert rc == drift.EXIT_DRIFT and stand_in["target"].read_text() == "export CUDA=12.6\n", output
    plan = latest(stand_in)["plan"]
    assert plan and json.loads(Path(plan).read_text())["tags"] == ["cuda_toolkit"]
    # The drift changed since: the plan no longer matches, nothing is applied.
    stand_in["target"].write_text("export CUDA=11.0\n")
    rc, output = stand_in["run"]("apply", policy, plan)
    assert rc == drift.EXIT_FAILED and stand_in["target"].read_text() == "export CUDA=11.0\n", output
    assert "were not approved" in " ".join(latest(stand_in)["notes"])
    stand_in["target"].write_text("export CUDA=12.6\n")
    rc, output = stand_in["run"]("apply", policy, plan)
    assert rc == drift.EXIT_REPAIRED and stand_in["target"].read_text() == "export CUDA=12.8\n", output


def test_bad_policy_stops_before_any_run(stand_in, capsys):
    rc = drift.main(["check", "-i", "/nonexistent-inventory", "--reports", str(stand_in["reports"])])
    assert rc == drift.EXIT_FAILED and "inventory '/nonexistent-inventory'" in capsys.readouterr().err
    with pytest.raises(drift.DriftInputError) as refused:
        stand_in["run"]("check", {"gpu_drift_policy": {"cuda": "fix"}})
    assert "gpu_drift_policy.cuda='fix'" in str(refused.value)
    assert not list((stand_in["reports"]).glob("*/artifacts"))


def test_a_censored_result_counts_as_changed_only_when_the_run_printed_changed():
    base = {"task_uuid": "x", "role": "gpu_ops.cluster.grafana", "task": "Apply the admin Secret"}
    changed = {**event("runner_on_ok", host="localhost", res={"censored": "hidden"}, **base),
               "stdout": "\x1b[0;33mchanged: [localhost]\x1b[0m"}
    unchanged = {**event("runner_on_ok", host="localhost", res={"censored": "hidden"}, **base), "stdout": "ok: [localhost]"}
    (found,) = drift.items_from_events([changed, unchanged]).items
    assert found.drift_class == "monitoring" and found.diff == drift.HIDDEN


def test_only_check_mode_skips_are_unverifiable():
    lines = [json.dumps({"host": "gpu-0", "task": "Rebuild the initramfs", "task_uuid": "a", "role": "gpu_ops.cluster.nvidia_driver",
                         "check_mode": True, "reason": "Command would have run if not in check mode"}),
             json.dumps({"host": "gpu-0", "task": "Install on RHEL", "task_uuid": "b", "role": "nvidia_driver",
                         "check_mode": True, "reason": "Conditional result was False"}),
             json.dumps({"host": "gpu-0", "task": "Real run", "task_uuid": "c", "role": "nvidia_driver",
                         "check_mode": False, "reason": "Command would have run if not in check mode"}),
             '{"host": "gpu-0", "task": "cut sh']
    assert drift.unverifiable_from_skips(lines) == [{"host": "gpu-0", "role": "nvidia_driver",
                                                     "task": "Rebuild the initramfs",
                                                     "reason": "Command would have run if not in check mode"}]


def test_server_bookkeeping_is_not_drift_and_module_before_after_values_are():
    before = {"metadata": {"resourceVersion": "1", "managedFields": [{"a": 1}], "labels": {"x": "1"}},
              "status": {"used": {}}, "spec": {"hard": {"g": "20"}}}
    after = {"metadata": {"resourceVersion": "2", "managedFields": [{"a": 2}], "labels": {"x": "1"}, "annotations": {
        "kubectl.kubernetes.io/last-applied-configuration": "{}"}}, "status": {"used": {"g": "0"}}, "spec": {"hard": {"g": "14"}}}
    assert drift.diff_of({"diff": {"before": before, "after": after}}) == [
        {"path": "spec.hard.g", "before": "20", "after": "14"}]
    assert drift.diff_of({"before": "install", "after": "hold", "invocation": {"module_args": {"name": "nvidia-smi"}}}) == [
        {"path": "nvidia-smi", "before": "install", "after": "hold"}]


def test_a_run_started_while_another_holds_the_lock_exits_4_and_runs_nothing(tmp_path, capsys):
    reports = tmp_path / "reports"
    with drift.RunLock(reports / "drift.lock"):
        rc = drift.main(["check", "-i", "localhost,", "--reports", str(reports)])
    assert rc == drift.EXIT_LOCKED
    assert "another drift run holds" in capsys.readouterr().err
    assert [p.name for p in reports.iterdir()] == ["drift.lock"]


def test_the_annotation_is_read_from_a_real_partial_diff():
    """kubernetes.core's check-mode diff holds only what would change (recorded on the lab: a quota raised by hand on an
    object annotated to opt out); the annotation, unchanged, is only in the object the apply would make."""
    made = live("ResourceQuota", "team-quota", QUOTA, {drift.OPT_OUT_UNTIL: "2099-12-31", drift.OPT_OUT_REASON: "trial"})
    real = {"changed": True, "method": "apply", "result": made, "diff": {
        "before": {"spec": {"hard": {"requests.nvidia.com/gpu": "22"}}, "metadata": {"managedFields": []}},
        "after": {"spec": {"hard": {"requests.nvidia.com/gpu": "8"}}, "metadata": {"managedFields": []}}}}
    (found,) = drift.items_from_events(team_events(real)).items
    assert found.opt_out_annotations == {drift.OPT_OUT_UNTIL: "2099-12-31", drift.OPT_OUT_REASON: "trial"}
    assert found.diff == [{"path": "spec.hard.requests.nvidia.com/gpu", "before": "22", "after": "8"}]
    # The apply would add it (only in the diff's after): not the live object's.
    adding = {**real, "diff": {"before": real["diff"]["before"], "after": {
        **real["diff"]["after"], "metadata": {"annotations": {drift.OPT_OUT_UNTIL: "2099-12-31"}}}}}
    (found,) = drift.items_from_events(team_events(adding)).items
    assert drift.OPT_OUT_UNTIL not in found.opt_out_annotations


def test_a_quarantine_to_do_is_one_gpu_health_item_per_node_naming_the_taint_and_annotation():
    from ansible_collections.gpu_ops.cluster.plugins.module_utils import gpu_quarantine as q

    nodes = [{"metadata": {"name": "gpu-h100-0"}, "spec": {}}, {"metadata": {"name": "gpu-h100-1"}, "spec": {}}]
    plan = q.plan(nodes, {"gpu-h100-0": {"healthy": False, "problems": ["GPU 3: Xid 79"]},
                          "gpu-h100-1": {"healthy": True, "problems": []}}, ["gpu-h100-0", "gpu-h100-1"], 100, "now")
    result = {"changed": True, "result": {"results": q.node_changes(nodes, plan["patches"])}}
    events = [
        event("playbook_on_play_start", name="Check the GPUs of every GPU node"),
        event("playbook_on_task_start", task="Read the GPUs and the kernel log", role="gpu_ops.cluster.gpu_health",
              task_uuid="n1"),
        *(event("runner_on_ok", host=name, task="Read the GPUs and the kernel log", task_uuid="n1",
                res={"changed": False}) for name in ("gpu-h100-0", "gpu-h100-1")),
        event("playbook_on_play_start", name="Quarantine the unhealthy GPU nodes, release the healthy ones"),
        event("playbook_on_task_start", task="Quarantine the unhealthy GPU nodes and release the healthy ones",
              role="gpu_ops.cluster.gpu_health", task_uuid="h1"),
        event("runner_on_ok", host="localhost", task="Quarantine the unhealthy GPU nodes and release the healthy ones",
              task_uuid="h1", resolved_action="gpu_ops.cluster.gpu_node_quarantine", res=result),
    ]
    (found,) = drift.items_from_events(events).items
    assert (found.host, found.drift_class, found.resource) == ("localhost", "gpu_health", "Node/gpu-h100-0")
    assert found.reads == ["gpu-h100-0", "gpu-h100-1"]  # the verdicts it was decided from: its repair reads them
    paths = {change["path"] for change in found.diff}
    assert paths == {"spec.taints", f"metadata.annotations.{q.ANNOTATION_KEY}"}, found.diff


@pytest.mark.parametrize(("given", "expected"), [
    (None, "gpu_ops.cluster.check_mode_skips,gpu_ops.cluster.preload"),
    ("", "gpu_ops.cluster.check_mode_skips,gpu_ops.cluster.preload"),
    ("mine, gpu_ops.cluster.preload", "mine,gpu_ops.cluster.preload,gpu_ops.cluster.check_mode_skips"),
])
def test_a_run_enables_the_callers_callbacks_and_the_two_the_runner_needs(given, expected):
    assert drift.callbacks_enabled(given) == expected
