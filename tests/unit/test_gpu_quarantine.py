"""plugins/module_utils/gpu_quarantine.py: which GPU nodes the health quarantine taints, keeps, releases or holds
back, and the JSON patch it sends (applied here by a small RFC 6902 interpreter to show what the node becomes)."""

from __future__ import annotations

import json

import pytest

from ansible_collections.gpu_ops.cluster.plugins.module_utils import gpu_quarantine as q

NOW = "2026-12-06T05:00:00Z"
XID = "GPU 3 (0000:5d:00): expected no GPU Xid error since boot, found Xid 79 (GPU has fallen off the bus)"
ECC = "GPU 0 (GPU-0): expected 0 uncorrected ECC errors since the driver loaded, found 2"


def node(name, taints=None, annotations=None, unschedulable=None):
    spec = {}
    if taints is not None:
        spec["taints"] = taints
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    metadata = {"name": name, "resourceVersion": "7", "labels": {"nvidia.com/gpu.present": "true"}}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": spec}


apply = q.apply_patch  # RFC 6902 as the server applies it: a failed test operation raises


OURS = {"key": q.TAINT_KEY, "value": "true", "effect": "NoSchedule"}
USERS = {"key": "team.example/maintenance", "value": "disk", "effect": "NoSchedule"}


def test_an_unhealthy_node_is_tainted_and_annotated_and_nothing_else_changes():
    before = node("gpu-h100-0", taints=[USERS], annotations={"other": "x"}, unschedulable=True)
    result = q.plan([before], {"gpu-h100-0": {"healthy": False, "problems": [XID]}}, ["gpu-h100-0"], 100, NOW)
    assert result["quarantine"] == ["gpu-h100-0"]
    after = apply(before, result["patches"]["gpu-h100-0"])
    assert after["spec"] == {"taints": [USERS, OURS], "unschedulable": True}  # the person's cordon and taint stay
    assert json.loads(after["metadata"]["annotations"][q.ANNOTATION_KEY]) == {"since": NOW, "problems": [XID]}
    assert after["metadata"]["annotations"]["other"] == "x"
    # The taints are tested first: a taint another controller added since the read makes the patch fail, not vanish.
    assert result["patches"]["gpu-h100-0"][0] == {"op": "test", "path": "/spec/taints", "value": [USERS]}
    with pytest.raises(ValueError, match="test failed"):
        apply(node("gpu-h100-0", taints=[USERS, {"key": "new", "effect": "NoSchedule"}]),
              result["patches"]["gpu-h100-0"])


def test_a_node_without_taints_or_annotations_gets_both_added():
    before = node("gpu-a100-0")
    result = q.plan([before], {"gpu-a100-0": {"healthy": False, "problems": [ECC]}}, ["gpu-a100-0"], 100, NOW)
    after = apply(before, result["patches"]["gpu-a100-0"])
    assert after["spec"]["taints"] == [OURS]
    assert json.loads(after["metadata"]["annotations"][q.ANNOTATION_KEY])["problems"] == [ECC]


def test_release_only_when_healthy_removing_only_what_the_quarantine_set():
    note = json.dumps({"since": "2026-12-05T00:00:00Z", "problems": [XID]})
    before = node("gpu-h100-0", taints=[USERS, OURS], annotations={q.ANNOTATION_KEY: note, "other": "x"},
                  unschedulable=True)
    still = q.plan([before], {"gpu-h100-0": {"healthy": False, "problems": [XID]}}, ["gpu-h100-0"], 100, NOW)
    assert still["keep"] == ["gpu-h100-0"] and still["patches"] == {}
    result = q.plan([before], {"gpu-h100-0": {"healthy": True, "problems": []}}, ["gpu-h100-0"], 100, NOW)
    assert result["release"] == ["gpu-h100-0"]
    after = apply(before, result["patches"]["gpu-h100-0"])
    assert after["spec"] == {"taints": [USERS], "unschedulable": True}  # a person's cordon is never undone
    assert after["metadata"]["annotations"] == {"other": "x"}
    # A healthy node that was never quarantined is not touched, whatever else it carries.
    untouched = q.plan([node("gpu-h100-1", taints=[USERS], unschedulable=True)],
                       {"gpu-h100-1": {"healthy": True, "problems": []}}, ["gpu-h100-1"], 100, NOW)
    assert untouched["patches"] == {} and untouched["release"] == []


def test_new_reasons_update_the_annotation_and_keep_since():
    note = json.dumps({"since": "2026-12-05T00:00:00Z", "problems": [XID]})
    before = node("gpu-h100-0", taints=[OURS], annotations={q.ANNOTATION_KEY: note})
    result = q.plan([before], {"gpu-h100-0": {"healthy": False, "problems": [XID, ECC]}}, ["gpu-h100-0"], 100, NOW)
    assert result["update"] == ["gpu-h100-0"]
    after = apply(before, result["patches"]["gpu-h100-0"])
    assert json.loads(after["metadata"]["annotations"][q.ANNOTATION_KEY]) == {
        "since": "2026-12-05T00:00:00Z", "problems": [XID, ECC]}
    assert after["spec"]["taints"] == [OURS]


def test_the_circuit_breaker_holds_when_every_node_reports_a_fault():
    names = [f"gpu-{index}" for index in range(10)]
    nodes = [node(name) for name in names]
    everyone = {name: {"healthy": False, "problems": [XID]} for name in names}
    result = q.plan(nodes, everyone, names, 20, NOW)
    assert result["limit"] == 2
    assert result["quarantine"] == ["gpu-0", "gpu-1"] and result["held_back"] == names[2:]
    assert q.summary(result, 10)[-1] == ("held back by the circuit breaker (at most 2 of 10 GPU nodes quarantined): "
                                         + ", ".join(names[2:]))
    # Those already quarantined count: with two tainted, a third fault is only reported.
    nodes[5] = node("gpu-5", taints=[OURS])
    nodes[7] = node("gpu-7", taints=[OURS])
    again = q.plan(nodes, {"gpu-1": {"healthy": False, "problems": [XID]}}, names, 20, NOW)
    assert again["quarantine"] == [] and again["held_back"] == ["gpu-1"]
    # Releasing is never held back.
    released = q.plan(nodes, {"gpu-5": {"healthy": True, "problems": []}}, names, 0, NOW)
    assert released["release"] == ["gpu-5"]


def test_a_verdict_with_problems_is_unhealthy_and_unknown_nodes_are_reported():
    result = q.plan([node("gpu-0")], {"gpu-0": {"healthy": True, "problems": [ECC]}, "gone": {"healthy": False}},
                    ["gpu-0"], 100, NOW)
    assert result["quarantine"] == ["gpu-0"] and result["missing"] == ["gone"]


def test_annotation_keys_are_escaped_in_json_pointers():
    assert q.pointer("metadata", "annotations", "gpu-cluster.dev/gpu-health") == \
        "/metadata/annotations/gpu-cluster.dev~1gpu-health"
    assert q.pointer("a~b") == "/a~0b"


def test_the_modules_inputs_are_refused_by_name_value_and_what_is_allowed():
    from ansible_collections.gpu_ops.cluster.plugins.modules import gpu_node_quarantine as module

    params = {"max_unhealthy_percent": 120, "page_size": 0,
              "verdicts": {"gpu-0": {"healthy": "no"}, "gpu-1": {"healthy": True, "problems": []}},
              "reported_problems": {"gpu-2": "Xid 79"}}
    assert module.input_problems(params) == [
        "max_unhealthy_percent=120; allowed: 0 to 100",
        "page_size=0; allowed: a positive integer",
        "verdicts.gpu-0={'healthy': 'no'}; allowed: {healthy: true or false, problems: [text, ...]}",
        "reported_problems.gpu-2='Xid 79'; allowed: a list of problems (text)",
    ]


def test_problems_another_source_reports_make_a_node_unhealthy_but_only_its_own_verdict_releases_it():
    merged = q.with_reported({"gpu-0": {"healthy": True, "problems": []}, "gpu-1": {"healthy": True, "problems": []}},
                             {"gpu-0": [XID], "gpu-2": [ECC], "gpu-1": []})
    assert merged == {"gpu-0": {"healthy": False, "problems": [XID]}, "gpu-1": {"healthy": True, "problems": []},
                      "gpu-2": {"healthy": False, "problems": [ECC]}}
    note = json.dumps({"since": "2026-12-05T00:00:00Z", "problems": [ECC]})
    held = node("gpu-2", taints=[OURS], annotations={q.ANNOTATION_KEY: note})
    # Without a verdict of its own and with nothing reported, a quarantined node stays quarantined.
    result = q.plan([held], q.with_reported({}, {}), ["gpu-2"], 100, NOW)
    assert result["patches"] == {} and result["release"] == []


def test_the_patch_interpreter_refuses_what_the_server_refuses_and_the_changes_name_each_node():
    with pytest.raises(ValueError, match="replace: nothing"):
        apply({"spec": {}}, [{"op": "replace", "path": "/spec/taints", "value": []}])
    with pytest.raises(ValueError, match="remove: nothing"):
        apply({"metadata": {}}, [{"op": "remove", "path": "/metadata/annotations"}])
    with pytest.raises(ValueError, match="no object"):
        apply({}, [{"op": "add", "path": "/metadata/annotations/x", "value": "y"}])
    before = node("gpu-h100-0", taints=[USERS], annotations={"other": "x"})
    result = q.plan([before, node("gpu-h100-1")], {"gpu-h100-0": {"healthy": False, "problems": [XID]},
                                                   "gpu-h100-1": {"healthy": True, "problems": []}},
                    ["gpu-h100-0", "gpu-h100-1"], 100, NOW)
    changes = q.node_changes([before], result["patches"])
    assert [change["result"] for change in changes] == [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-h100-0"}}]
    diff = changes[0]["diff"]
    assert diff["before"] == {"spec": {"taints": [USERS]}, "metadata": {"annotations": {q.ANNOTATION_KEY: None}}}
    assert diff["after"]["spec"]["taints"] == [USERS, OURS]
    assert json.loads(diff["after"]["metadata"]["annotations"][q.ANNOTATION_KEY])["problems"] == [XID]


def test_a_node_in_a_rolling_driver_upgrade_is_left_to_the_rollout():
    from ansible_collections.gpu_ops.cluster.plugins.module_utils import gpu_upgrade as u

    upgrading = node("gpu-h100-0")
    upgrading["metadata"]["labels"][u.STATE_LABEL] = u.VALIDATION
    done = node("gpu-h100-1")
    done["metadata"]["labels"][u.STATE_LABEL] = u.DONE
    result = q.plan([upgrading, done], {"gpu-h100-0": {"healthy": False, "problems": [XID]},
                                        "gpu-h100-1": {"healthy": False, "problems": [XID]}},
                    ["gpu-h100-0", "gpu-h100-1"], 100, NOW)
    assert result["upgrading"] == ["gpu-h100-0"] and result["quarantine"] == ["gpu-h100-1"]
    assert "in a rolling driver upgrade (left to it): gpu-h100-0" in q.summary(result, 2)
