"""plugins/module_utils/gpu_upgrade.py: the rolling driver upgrade's plan (order, batches, max_unavailable counting
nodes already out, resume from the state labels, skip and failed nodes) and each node's patches and pod choices."""

from __future__ import annotations

import json

import pytest

from ansible_collections.gpu_ops.cluster.plugins.module_utils import gpu_upgrade as u

GPU_NODES = ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def node(name, state=None, cordoned=False, skip=False, record=None, gpus="8", ready=True):
    labels = {"nvidia.com/gpu.present": "true"}
    if state:
        labels[u.STATE_LABEL] = state
    if skip:
        labels[u.SKIP_LABEL] = "true"
    metadata = {"name": name, "labels": labels}
    if record is not None:
        metadata["annotations"] = {u.ANNOTATION_KEY: json.dumps(record)}
    return {"metadata": metadata, "spec": {"unschedulable": True} if cordoned else {},
            "status": {"allocatable": {"cpu": "64", "nvidia.com/gpu": gpus},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


@pytest.mark.parametrize("value, total, expected", [
    (1, 4, 1), ("2", 4, 2), ("25%", 4, 1), ("50%", 4, 2), ("10%", 4, 1), ("100%", 3, 3), ("34%", 3, 1)])
def test_max_unavailable_is_a_count_or_a_share_rounded_down_but_at_least_one(value, total, expected):
    assert u.unavailable_budget(value, total) == expected


@pytest.mark.parametrize("value", [0, -1, "0", "0%", "150%", "x", "2.5", True, "%"])
def test_a_bad_max_unavailable_is_refused_naming_it_and_what_is_allowed(value):
    with pytest.raises(ValueError, match=r"max_unavailable=.*allowed: a whole number of nodes"):
        u.parse_max_unavailable(value)


def test_batches_follow_the_given_order_then_names_and_skip_done_nodes():
    nodes = [node(name) for name in GPU_NODES]
    plan = u.plan_rollout(nodes, {"gpu-0": True, "gpu-1": True, "gpu-2": False, "gpu-3": True}, GPU_NODES, 2,
                          order=["gpu-3"])
    assert plan["queue"] == ["gpu-3", "gpu-0", "gpu-1"] and plan["done"] == ["gpu-2"]
    assert plan["batches"] == [["gpu-3", "gpu-0"], ["gpu-1"]] and plan["batch_size"] == 2


def test_nodes_already_unavailable_take_slots_and_a_full_budget_blocks_the_rollout():
    nodes = [node("gpu-0"), node("gpu-1", cordoned=True), node("gpu-2"), node("gpu-3")]
    needs = dict.fromkeys(["gpu-0", "gpu-2", "gpu-3"], True) | {"gpu-1": False}
    plan = u.plan_rollout(nodes, needs, GPU_NODES, 2)
    assert plan["unavailable"] == ["gpu-1"] and plan["batches"] == [["gpu-0"], ["gpu-2"], ["gpu-3"]]
    blocked = u.plan_rollout(nodes, needs, GPU_NODES, 1)
    assert blocked["batches"] == [] and blocked["queue"] == [] and "1 already are (gpu-1)" in blocked["blocked"]
    assert any(line.startswith("blocked: max_unavailable allows 1") for line in u.plan_summary(blocked, "590", False))


def test_a_rerun_resumes_in_progress_nodes_first_skips_done_and_held_and_retries_failed_only_when_asked():
    nodes = [node("gpu-0", state=u.DONE), node("gpu-1", state=u.POD_DELETION, cordoned=True),
             node("gpu-2", state=u.FAILED, cordoned=True), node("gpu-3", skip=True)]
    needs = {"gpu-0": False, "gpu-1": True, "gpu-2": True, "gpu-3": True}
    plan = u.plan_rollout(nodes, needs, GPU_NODES, 1)
    # The failed node's cordon takes the only slot, but the resumed node is already out and goes on.
    assert plan["queue"] == ["gpu-1"] and plan["batches"] == [["gpu-1"]]
    assert plan["done"] == ["gpu-0"] and plan["failed_before"] == ["gpu-2"] and plan["skipped"] == ["gpu-3"]
    retry = u.plan_rollout(nodes, needs, GPU_NODES, 1, retry_failed=True)
    assert retry["queue"] == ["gpu-1", "gpu-2"] and retry["batches"] == [["gpu-1"], ["gpu-2"]]
    summary = u.plan_summary(retry, "590", drain=False)
    assert summary[0] == ("batch 1: gpu-1 -> driver 590 (cordon-required -> wait-for-jobs-required -> "
                          "pod-deletion-required -> validation-required -> uncordon-required -> upgrade-done)")


def test_resumed_nodes_beyond_the_budget_go_together_first_and_unreached_ones_are_left():
    nodes = [node("gpu-0", state=u.CORDON, cordoned=True), node("gpu-1", state=u.VALIDATION, cordoned=True),
             node("gpu-2"), node("gpu-3", state=u.WAIT_FOR_JOBS, cordoned=True)]
    plan = u.plan_rollout(nodes, {"gpu-0": True, "gpu-1": True, "gpu-2": True}, GPU_NODES, 1)
    # gpu-3 is mid-upgrade but the run cannot reach it: reported, and its cordon takes the only slot, so gpu-2 waits.
    assert plan["unreachable"] == ["gpu-3"] and plan["unavailable"] == ["gpu-3"]
    assert plan["batches"] == [["gpu-0", "gpu-1"]] and plan["blocked"].endswith("gpu-2 not taken out")
    plan = u.plan_rollout(nodes, {"gpu-0": True, "gpu-1": True, "gpu-2": True, "gpu-3": True}, GPU_NODES, 1)
    assert plan["batches"] == [["gpu-0", "gpu-1", "gpu-3"], ["gpu-2"]]


def test_a_node_with_a_verdict_but_not_in_the_cluster_is_reported():
    plan = u.plan_rollout([node("gpu-0")], {"gpu-0": True, "gpu-9": True}, ["gpu-0"], 1)
    assert plan["missing"] == ["gpu-9"] and plan["queue"] == ["gpu-0"]


def test_cordon_records_a_persons_cordon_and_the_gpus_and_the_release_keeps_that_cordon():
    mine = node("gpu-0")
    patch, record = u.cordon_ops(mine, "590", "2026-12-06T08:00:00Z")
    assert patch["spec"] == {"unschedulable": True} and patch["metadata"]["labels"] == {u.STATE_LABEL: u.CORDON}
    assert record == {"cordoned_before": False, "allocatable": {"nvidia.com/gpu": "8"}, "target": "590",
                      "started": "2026-12-06T08:00:00Z"}
    released = u.uncordon_ops(node("gpu-0", record=record, cordoned=True))
    assert released == {"metadata": {"labels": {u.STATE_LABEL: u.DONE}, "annotations": {u.ANNOTATION_KEY: None}},
                        "spec": {"unschedulable": None}}
    theirs = node("gpu-1", cordoned=True)
    _, record = u.cordon_ops(theirs, "590", "now")
    assert record["cordoned_before"] is True
    assert "spec" not in u.uncordon_ops(node("gpu-1", record=record, cordoned=True))
    # Resumed: the first record stays (the node is cordoned now by the rollout itself).
    _, again = u.cordon_ops(node("gpu-1", record=record, cordoned=True), "590", "later")
    assert again == record


def pod(name, gpus=None, phase="Running", owner=None, deleting=False, annotations=None):
    resources = {"limits": {"nvidia.com/gpu": gpus}} if gpus else {}
    metadata = {"name": name, "namespace": "team", "annotations": annotations or {}}
    if owner:
        metadata["ownerReferences"] = [{"kind": owner, "name": "x"}]
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-06T08:00:00Z"
    return {"metadata": metadata, "spec": {"containers": [{"name": "main", "resources": resources}]},
            "status": {"phase": phase}}


def test_the_gpu_pods_still_running_are_moved_and_a_drain_moves_all_but_daemonsets_and_static_pods():
    pods = [pod("train", gpus="4", owner="Job"), pod("done", gpus="1", phase="Succeeded"), pod("web"),
            pod("plugin", owner="DaemonSet"), pod("static", annotations={"kubernetes.io/config.mirror": "x"}),
            pod("leaving", gpus="1", deleting=True)]
    assert [u.pod_ref(p) for p in u.pods_to_move(pods, drain=False)] == ["team/train"]
    assert [u.pod_ref(p) for p in u.pods_to_move(pods, drain=True)] == ["team/train", "team/web"]


def test_validation_compares_the_recorded_gpus_with_what_the_node_advertises_now():
    recorded = {"nvidia.com/gpu": "8"}
    assert u.missing_allocatable(recorded, node("gpu-0")) == []
    assert u.missing_allocatable(recorded, node("gpu-0", gpus="7")) == ["nvidia.com/gpu: 8 before, 7 now"]
    assert u.quantity("2Ki") == 2048 and u.quantity("500m") == 0.5
    assert u.is_ready(node("gpu-0")) and not u.is_ready(node("gpu-0", ready=False))


def test_counts_per_stage_for_the_metrics():
    nodes = [node("gpu-0", state=u.DONE), node("gpu-1", state=u.DRAIN), node("gpu-2", state=u.REQUIRED),
             node("gpu-3", state=u.FAILED), node("cpu-0")]
    assert u.counts(nodes, GPU_NODES) == {"pending": 1, "in_progress": 1, "done": 1, "failed": 1, "skipped": 0}


# --- the report and the metrics (plugins/filter/gpu_driver_upgrade.py) -------------------------------------------

def test_the_report_counts_upgraded_failed_and_unreached_nodes_and_its_metrics_parse(tmp_path):
    import subprocess

    from conftest import promtool_path

    from ansible_collections.gpu_ops.cluster.plugins.filter import gpu_driver_upgrade as f

    nodes = [node(name) for name in GPU_NODES]
    plan = u.plan_rollout(nodes, dict.fromkeys(GPU_NODES, True) | {"gpu-3": False}, GPU_NODES, 1)
    plan.update(target="590", summary=u.plan_summary(plan, "590", False), counts=u.counts(nodes, GPU_NODES))
    report = f.gpu_driver_upgrade_report(plan, {"gpu-0": {"state": "upgrade-done"},
                                                "gpu-1": {"state": "upgrade-failed", "failure": "validate: ..."}})
    assert report["upgraded"] == ["gpu-0"] and report["failed_now"] == ["gpu-1"] and report["not_reached"] == ["gpu-2"]
    assert report["counts"] == {"pending": 1, "in_progress": 0, "done": 2, "failed": 1, "skipped": 0}
    assert "not reached, the failure budget is spent (1 failed, 0 allowed): gpu-2" in report["summary"]
    held = f.gpu_driver_upgrade_report(plan, {"gpu-0": {"state": "upgrade-done"}, "gpu-1": {"state": "upgrade-failed"}},
                                       max_failed_nodes=1)
    assert "not reached, the failed nodes, left cordoned, hold every unavailable slot (1): gpu-2" in held["summary"]
    text = f.gpu_driver_upgrade_metrics(report)
    assert 'gpu_driver_upgrade_nodes{stage="failed"} 1\n' in text and "gpu_driver_upgrade_last_run_failed 1\n" in text
    check = subprocess.run([str(promtool_path()), "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    # Check mode: the plan's own counts, nothing moved.
    checked = f.gpu_driver_upgrade_report(plan, {}, check_mode=True)
    assert checked["counts"]["done"] == 0 and checked["not_reached"] == ["gpu-0", "gpu-1", "gpu-2"]
    with pytest.raises(Exception, match="not gpu_driver_upgrade_plan's result"):
        f.gpu_driver_upgrade_report({}, {})


def test_the_plan_modules_inputs_are_refused_by_name_value_and_what_is_allowed():
    from ansible_collections.gpu_ops.cluster.plugins.modules import gpu_driver_upgrade_plan as module

    params = {"max_unavailable": "0%", "nodes": {"gpu-0": {"installed": "580"}}, "page_size": 0}
    problems = module.input_problems(params)
    assert problems[0].startswith("max_unavailable='0%'; allowed: a whole number of nodes")
    assert problems[1].startswith("nodes.gpu-0={'installed': '580'}; allowed: {needs_upgrade: true or false")
    assert problems[2] == "page_size=0; allowed: a positive integer"


# --- one node's steps (plugins/modules/gpu_node_upgrade.py) against a stand-in for the API server -------------------

class FakeNode:
    """The requests a step makes, answered from memory: patches merged, evictions refused while `blocked`."""

    def __init__(self, node_obj, pods, blocked=()):
        from ansible_collections.gpu_ops.cluster.plugins.modules import gpu_node_upgrade as step

        self.obj, self.pod_list, self.blocked, self.patches, self.evictions = node_obj, pods, set(blocked), [], []
        self.name = node_obj["metadata"]["name"]
        self.claims = []
        self.params = {"target": "590", "gpu_resource_prefix": "nvidia.com/", "pod_selector": "", "wait_timeout": 0,
                       "eviction_timeout": 1, "validation_timeout": 1, "poll_interval": 0.05}
        self.step = step

    def read(self):
        return json.loads(json.dumps(self.obj))

    def patch(self, body):
        self.patches.append(body)

        def merge(target, change):
            for key, value in change.items():
                if value is None:
                    target.pop(key, None)
                elif isinstance(value, dict):
                    merge(target.setdefault(key, {}), value)
                else:
                    target[key] = value
        merge(self.obj, body)
        return self.obj

    def pods(self, selector=""):
        return list(self.pod_list)

    def gpu_claims(self):
        return u.gpu_claims(self.claims)

    def evict(self, pod):
        ref = u.pod_ref(pod)
        self.evictions.append(ref)
        if ref in self.blocked:
            return "Cannot evict pod as it would violate the pod's disruption budget."
        self.pod_list.remove(pod)
        return None


def test_the_steps_label_first_cordon_evict_validate_and_release_only_their_own_cordon():
    fake = FakeNode(node("gpu-0"), [pod("train", gpus="1"), pod("web")])
    step = fake.step
    assert step.run_step(fake, "cordon", "now")["record"]["cordoned_before"] is False
    assert fake.obj["spec"]["unschedulable"] is True and u.state_of(fake.obj) == u.CORDON
    result = step.run_step(fake, "pod-deletion", "now")
    assert result["evicted"] == ["team/train"] and [u.pod_ref(p) for p in fake.pod_list] == ["team/web"]
    assert fake.patches[-1] == u.state_patch(u.POD_DELETION)  # the state shows before the step acts
    assert step.run_step(fake, "validate", "now")["state"] == u.VALIDATION
    assert step.run_step(fake, "uncordon", "now")["state"] == u.DONE
    assert "unschedulable" not in fake.obj["spec"] and u.state_of(fake.obj) == u.DONE
    assert u.ANNOTATION_KEY not in fake.obj["metadata"].get("annotations", {})


def test_a_refused_eviction_fails_the_step_after_its_timeout_and_nothing_is_forced():
    fake = FakeNode(node("gpu-0"), [pod("protected", gpus="1")], blocked={"team/protected"})
    with pytest.raises(fake.step.StepFailed, match="eviction refused for 1 s, nothing forced: team/protected: "
                                                   "Cannot evict pod as it would violate"):
        fake.step.run_step(fake, "pod-deletion", "now")
    assert len(fake.evictions) > 1 and [u.pod_ref(p) for p in fake.pod_list] == ["team/protected"]


def test_validation_fails_naming_what_is_missing_and_a_persons_cordon_survives_the_release():
    fake = FakeNode(node("gpu-0", cordoned=True), [])
    fake.step.run_step(fake, "cordon", "now")
    fake.obj["status"]["allocatable"]["nvidia.com/gpu"] = "7"
    with pytest.raises(fake.step.StepFailed, match="nvidia.com/gpu: 8 before, 7 now"):
        fake.step.run_step(fake, "validate", "now")
    fake.step.run_step(fake, "failed", "now")
    assert u.state_of(fake.obj) == u.FAILED and u.record_of(fake.obj)["cordoned_before"] is True
    fake.step.run_step(fake, "uncordon", "now")
    assert fake.obj["spec"]["unschedulable"] is True  # it was the person's


def test_a_mig_reconfiguration_shows_the_mig_managers_labels_and_validates_the_layouts_resources():
    fake = FakeNode(node("gpu-0"), [pod("train", gpus="1")])
    fake.params["operation"] = "mig-reconfigure"
    step = fake.step
    step.run_step(fake, "cordon", "now")
    labels = fake.obj["metadata"]["labels"]
    assert labels[u.MIG_STATE_LABEL] == "pending" and u.STATE_LABEL not in labels
    assert u.record_of(fake.obj, u.MIG_ANNOTATION_KEY)["allocatable"] == {"nvidia.com/gpu": "8"}
    assert u.taken_out(fake.obj)
    assert step.run_step(fake, "pod-deletion", "now")["evicted"] == ["team/train"]
    # The layout changes the resources: what the module expects is checked, not what was recorded.
    fake.params["expected_allocatable"] = {"nvidia.com/mig-1g.10gb": 7}
    with pytest.raises(step.StepFailed, match="nvidia.com/mig-1g.10gb: 7 expected, 0 now"):
        step.run_step(fake, "validate", "now")
    fake.obj["status"]["allocatable"] = {"nvidia.com/mig-1g.10gb": "7"}
    step.run_step(fake, "validate", "now")
    assert step.run_step(fake, "uncordon", "now")["state"] == "success"
    assert labels is not None and fake.obj["metadata"]["labels"][u.MIG_STATE_LABEL] == "success"
    assert "unschedulable" not in fake.obj["spec"] and not u.taken_out(fake.obj)
    step.run_step(fake, "failed", "now")
    assert fake.obj["metadata"]["labels"][u.MIG_STATE_LABEL] == "failed"


def test_a_pod_holding_a_gpu_claim_of_dra_is_a_gpu_pod_and_is_evicted():
    claim = {"metadata": {"namespace": "team", "name": "trainer-gpus-x7"}, "status": {"allocation": {"devices": {
        "results": [{"driver": "gpu.nvidia.com", "pool": "gpu-0", "device": "gpu-3", "request": "gpus"}]}}}}
    nic = {"metadata": {"namespace": "team", "name": "nic"}, "status": {"allocation": {"devices": {
        "results": [{"driver": "rdma.example.com", "pool": "gpu-0", "device": "nic-0", "request": "nic"}]}}}}
    assert u.gpu_claims([claim, nic, {"metadata": {"namespace": "team", "name": "pending"}}]) == {"team/trainer-gpus-x7"}
    dra = pod("trainer")
    dra["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "trainer-gpus-x7"}]
    other = pod("netonly")
    other["spec"]["resourceClaims"] = [{"name": "nic", "resourceClaimName": "nic"}]
    assert u.gpu_request(dra, claims={"team/trainer-gpus-x7"}) and not u.gpu_request(dra)
    assert not u.gpu_request(other, claims={"team/trainer-gpus-x7"})
    fake = FakeNode(node("gpu-0"), [dra, other, pod("web")])
    fake.claims = [claim, nic]
    assert fake.step.run_step(fake, "pod-deletion", "now")["evicted"] == ["team/trainer"]


# --- gpu_driver_upgrade_order: only GPU nodes, refused before the first change (issue 35) -------------------------

def test_an_order_naming_a_host_that_is_not_a_gpu_node_is_refused_naming_it_and_the_gpu_nodes():
    assert u.order_problems(["gpu-2", "cpu-0", "gpu-0"], GPU_NODES, "gpu_driver_upgrade_order") == [
        'gpu_driver_upgrade_order[1]="cpu-0" is not a GPU node; allowed: names of GPU nodes (gpu-0, gpu-1, gpu-2, '
        'gpu-3)']
    assert u.order_problems(["gpu-3", "gpu-1"], GPU_NODES) == []
    assert u.order_problems(["gpu-0"], []) == ['order[0]="gpu-0" is not a GPU node; allowed: [] (no GPU nodes)']
    assert u.order_problems("gpu-0", GPU_NODES) == []  # not a list: the preflight's form check reports it


def test_the_role_preflight_refuses_an_order_naming_no_gpu_node_before_anything_is_read():
    from test_input_forms import PLAY, preflight

    groups = dict(PLAY["groups"], gpu_nodes=["gpu-0", "gpu-1"], cluster_control=["control-0"])
    problems = preflight("gpu_driver_upgrade").problems(groups=groups, gpu_driver_upgrade_order=["gpu-1", "control-0"])
    assert problems == ['gpu_driver_upgrade_order[1]="control-0" is not a GPU node; allowed: names of GPU nodes '
                        '(gpu-0, gpu-1)'], problems
    assert preflight("gpu_driver_upgrade").problems(groups=groups, gpu_driver_upgrade_order=["gpu-1", "gpu-0"]) == []


def test_the_plan_module_refuses_an_order_naming_no_gpu_node_before_it_labels_a_node(monkeypatch):
    from ansible_collections.gpu_ops.cluster.plugins.modules import gpu_driver_upgrade_plan as module

    nodes = [node("gpu-0"), node("gpu-1"), {"metadata": {"name": "cpu-0", "labels": {}}}]
    calls = []

    def pages(api, path, size, query=()):
        selected = [n for n in nodes if not query or n["metadata"]["labels"].get("nvidia.com/gpu.present") == "true"]
        yield {"items": selected}

    def call_json(*args, **kwargs):
        calls.append(args)
        return {}

    class Failed(Exception):
        pass

    class Module:
        check_mode = False
        params = {"kubeconfig": None, "context": None, "nodes": {"gpu-0": {"needs_upgrade": True},
                                                                 "gpu-1": {"needs_upgrade": True}},
                  "target": "590", "order": ["cpu-0"], "max_unavailable": 1, "retry_failed": False, "drain": False,
                  "gpu_node_selector": "nvidia.com/gpu.present=true", "page_size": 500}

        def __init__(self, **kwargs):
            pass

        def fail_json(self, msg, **kwargs):
            raise Failed(msg)

        def exit_json(self, **kwargs):
            raise AssertionError("planned: %r" % kwargs)

    monkeypatch.setattr(module, "AnsibleModule", Module)
    monkeypatch.setattr(module, "KUBERNETES_IMPORT_ERROR", None)
    monkeypatch.setattr(module, "api_client", lambda *args: object())
    monkeypatch.setattr(module, "pages", pages)
    monkeypatch.setattr(module, "call_json", call_json)
    with pytest.raises(Failed) as failed:
        module.main()
    assert str(failed.value) == 'order[0]="cpu-0" is not a GPU node; allowed: names of GPU nodes (gpu-0, gpu-1)'
    assert calls == []
