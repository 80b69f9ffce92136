"""plugins/filter/training_workloads.py: the training_workloads role's preflight check."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import REPO_ROOT, load_filter_plugin

workloads = load_filter_plugin("training_workloads")
DEFAULTS = yaml.safe_load((REPO_ROOT / "roles" / "training_workloads" / "defaults" / "main.yml").read_text())


def test_the_default_workloads_are_valid():
    assert workloads.training_workload_problems(DEFAULTS["training_workloads_jobs"]) == []


@pytest.mark.parametrize(("change", "expected"), [
    ({"name": "Train"}, "training_workloads_jobs[0].name='Train'; allowed: a DNS-1123 label"),
    ({"name": "x" * 51}, "allowed: a DNS-1123 label starting with a letter, at most 50 characters"),
    ({"kind": "jax"}, "kind='jax'; allowed: tensorflow, pytorch, pytorch-distributed"),
    ({"gpus": 0}, "gpus=0; allowed: a whole number >= 1"),
    ({"gpus": "1"}, "gpus='1'; allowed"),
    ({"kind": "pytorch-distributed", "workers": 1}, "workers=1; allowed: a whole number >= 2"),
    ({"product": "NVIDIA H100"}, "product='NVIDIA H100'; allowed: a GPU product label value"),
    ({"cpu": 4}, "cpu=4; allowed: a Kubernetes quantity such as 8, 500m, 1.5Gi or 64Gi (quoted, as a string)"),
    ({"memory": "-1Gi"}, "memory='-1Gi'; allowed"),
    ({"gpu": 1}, "training_workloads_jobs[0].gpu is not a known key"),
    ({"labels": {"team": 7}}, 'training_workloads_jobs[0].labels.team=7 is not a label value'),
    ({"labels": {"bad key!": "x"}}, 'training_workloads_jobs[0].labels key "bad key!" is not a label key'),
    ({"labels": {"job-name": "x"}}, "training_workloads_jobs[0].labels['job-name'] is set by the role"),
    ({"labels": ["a"]}, 'training_workloads_jobs[0].labels=["a"] is not a mapping of labels'),
    ({"annotations": {"note": True}}, "training_workloads_jobs[0].annotations.note=true is not an annotation value"),
    ({"annotations": {"batch.kubernetes.io/job-completion-index": "0"}},
     "annotations['batch.kubernetes.io/job-completion-index'] is set by the Job controller"),
])
def test_bad_workloads_are_named(change, expected):
    job = {**DEFAULTS["training_workloads_jobs"][0], **change}
    found = workloads.training_workload_problems([job])
    assert any(expected in problem for problem in found), found


def test_labels_and_annotations_of_a_job_are_accepted():
    job = {**DEFAULTS["training_workloads_jobs"][3], "labels": {"kueue.x-k8s.io/queue-name": "team-a"},
           "annotations": {"gpu-lab.dev/hold-running": "true", "example.com/note": ""}}
    assert workloads.training_workload_problems([job]) == []


def test_duplicates_and_empty():
    job = DEFAULTS["training_workloads_jobs"][0]
    assert workloads.training_workload_problems([job, job]) == [
        "training_workloads_jobs[1].name='tf-mnist-1gpu' repeats training_workloads_jobs[0]"]
    assert workloads.training_workload_problems([])[0].startswith("training_workloads_jobs=[]; allowed")


CLAIM_JOB = {"name": "bert", "kind": "pytorch", "gpus": 4, "cpu": "8", "memory": "32Gi", "gpu_request": "claim"}


def test_a_claim_job_needs_no_product_and_may_name_its_class_and_selectors():
    selector = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
    assert workloads.training_workload_problems([CLAIM_JOB]) == []
    assert workloads.training_workload_problems([{**CLAIM_JOB, "device_class": "h100.nvidia.com",
                                                  "selectors": [selector], "product": "NVIDIA-H100-80GB-HBM3"}]) == []
    # The role-wide default makes every job that does not say a claim job.
    job = {key: value for key, value in CLAIM_JOB.items() if key != "gpu_request"}
    assert workloads.training_workload_problems([job], "claim") == []
    assert workloads.training_workload_problems([job])[0].startswith("training_workloads_jobs[0].product=None")


@pytest.mark.parametrize(("change", "default", "expected"), [
    ({"gpu_request": "dra"}, "extended-resource",
     "training_workloads_jobs[0].gpu_request='dra'; allowed: extended-resource, claim"),
    ({"gpu_request": None}, "claim", "training_workloads_jobs[0].gpu_request=None; allowed"),
    ({"device_class": ""}, "claim", "training_workloads_jobs[0].device_class=''; allowed: a DeviceClass name"),
    ({"device_class": "GPU"}, "claim", "training_workloads_jobs[0].device_class='GPU'; allowed"),
    ({"selectors": "device.driver == 'gpu.nvidia.com'"}, "claim",
     "training_workloads_jobs[0].selectors=\"device.driver == 'gpu.nvidia.com'\"; allowed: a list of CEL expressions"),
    ({"selectors": ["ok", " "]}, "claim", "training_workloads_jobs[0].selectors[1]=' '; allowed: a CEL expression"),
    ({"gpus": 0}, "claim", "training_workloads_jobs[0].gpus=0; allowed: a whole number >= 1"),
    ({"product": "NVIDIA H100"}, "claim", "product='NVIDIA H100'; allowed: a GPU product label value such as "
     "NVIDIA-H100-80GB-HBM3 (optional with gpu_request: claim)"),
    ({"gpu_request": "extended-resource", "product": "NVIDIA-H100-80GB-HBM3", "device_class": "gpu.nvidia.com"},
     "claim", "training_workloads_jobs[0].device_class is only used with gpu_request: claim"),
    ({"gpu_request": "extended-resource", "product": "NVIDIA-H100-80GB-HBM3", "selectors": []}, "claim",
     "training_workloads_jobs[0].selectors is only used with gpu_request: claim"),
])
def test_bad_claim_settings_are_named_with_the_full_path(change, default, expected):
    found = workloads.training_workload_problems([{**CLAIM_JOB, **change}], default)
    assert any(expected in problem for problem in found), found


def test_an_unknown_role_wide_request_is_named():
    assert workloads.training_workload_problems([CLAIM_JOB], "dra") == [
        "training_workloads_gpu_request='dra'; allowed: extended-resource, claim"]


def template(name, count, device_class="gpu.nvidia.com"):
    return {"metadata": {"name": name}, "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
        "deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}}]}}}}


def test_the_claim_plan_replaces_changed_templates_and_removes_those_no_listed_job_wants():
    existing = [template("same", 1), template("more", 2), template("switched-back", 1), template("unlisted", 1)]
    wanted = [template("same", 1), template("more", 4), template("new", 2)]
    plan = workloads.training_workloads_claim_plan(existing, wanted, ["same", "more", "new", "switched-back"])
    assert plan == {"replace": ["more"], "remove": ["switched-back"]}
    # Nothing there (or no API: k8s_info found none): nothing to delete. A second run: nothing either.
    assert workloads.training_workloads_claim_plan([], wanted, ["same"]) == {"replace": [], "remove": []}
    assert workloads.training_workloads_claim_plan(wanted, wanted, ["same", "more", "new"]) == \
        {"replace": [], "remove": []}
    # state absent: nothing wanted, every listed job's template goes.
    assert workloads.training_workloads_claim_plan(existing, [], ["same", "more"]) == \
        {"replace": [], "remove": ["more", "same"]}
    # Another class is another spec.
    assert workloads.training_workloads_claim_plan([template("same", 1)], [template("same", 1, "mig.nvidia.com")],
                                                   ["same"])["replace"] == ["same"]


# -- the preflight's dry run of the claim templates ---------------------------------------------------------------------
DRY_RUN_STATUS = {  # the shape of the API server's Status for a selector its CEL compiler refuses
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid", "code": 422,
    "message": "ResourceClaimTemplate.resource.k8s.io \"dry-run-bad-cel\" is invalid: "
               "spec.spec.devices.requests[0].exactly.selectors[0].cel.expression: Invalid value: "
               "\"device.attributes['gpu.nvidia.com'].productName ==\": compilation failed: ERROR: <input>:1:50: "
               "Syntax error: mismatched input '<EOF>'"}


def dry_run_result(name: str, failed: bool, body: object = None) -> dict:
    """A loop item's result as the role registers it (failed_when: false, so failed is false either way)."""
    result = {"failed": False, "changed": False, "failed_when_result": False,
              "training_workloads_claim_template": {"metadata": {"name": name}}}
    if failed:  # kubernetes.core's k8s: "Failed to apply object: " + the response body, as the lab printed it
        result.update(msg="Failed to apply object: " + json.dumps(body or DRY_RUN_STATUS), reason="Unprocessable Entity")
    else:
        result.update(method="apply", result={"kind": "ResourceClaimTemplate", "metadata": {"name": "dry-run-" + name}})
    return result


def test_a_status_given_as_the_bytes_repr_is_read_too():
    result = dry_run_result("bad-cel", True)
    result["msg"] = "Failed to apply object: " + str(json.dumps(DRY_RUN_STATUS).encode())
    assert workloads.training_workloads_dry_run_problems([result], [{"name": "bad-cel"}])[0].endswith(
        DRY_RUN_STATUS["message"])


def test_a_refused_template_is_named_by_its_job_with_the_servers_own_reason():
    jobs = [{"name": "ok"}, {"name": "bad-cel"}]
    problems = workloads.training_workloads_dry_run_problems([dry_run_result("ok", False), dry_run_result("bad-cel", True)], jobs)
    assert problems == ["training_workloads_jobs[1] (bad-cel): the API server refuses its ResourceClaimTemplate (dry "
                        "run, nothing applied): " + DRY_RUN_STATUS["message"]]


def test_a_reason_that_is_not_a_status_is_kept_as_the_module_gave_it():
    result = dry_run_result("x", True)
    result["msg"] = "Failed to apply object: connection refused"
    assert workloads.training_workloads_dry_run_problems([result], []) == [
        "the claim template x: the API server refuses its ResourceClaimTemplate (dry run, nothing applied): "
        "Failed to apply object: connection refused"]
    assert workloads.training_workloads_dry_run_problems([{"skipped": True}], []) == []


def test_a_jobs_own_queue_label_must_not_contradict_the_roles_queue():
    job = {**DEFAULTS["training_workloads_jobs"][0], "labels": {"kueue.x-k8s.io/queue-name": "other"}}
    assert workloads.training_workload_problems([job], "extended-resource", "gpu") == [
        "training_workloads_jobs[0].labels['kueue.x-k8s.io/queue-name']='other' contradicts "
        "training_workloads_queue_name='gpu' (the Job would be queued in 'gpu', its pods labelled 'other'); allowed: "
        "leave the label out, or the same queue name"]
    same = {**job, "labels": {"kueue.x-k8s.io/queue-name": "gpu"}}
    assert workloads.training_workload_problems([same], "extended-resource", "gpu") == []
    assert workloads.training_workload_problems([job], "extended-resource", "") == []  # the job's own choice


def _node(name: str, product: str | None, gpus: str | None) -> dict:
    """A Node as the API server returns it (the fields the fit check reads)."""
    labels = {"kubernetes.io/hostname": name, **({"nvidia.com/gpu.product": product} if product else {})}
    allocatable = {"cpu": "64", "memory": "512Gi", **({"nvidia.com/gpu": gpus} if gpus is not None else {})}
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


NODES = [_node("gpu-h100-0", "NVIDIA-H100-80GB-HBM3", "8"), _node("gpu-h100-1", "NVIDIA-H100-80GB-HBM3", "4"),
         _node("gpu-a100-0", "NVIDIA-A100-SXM4-40GB", "8"), _node("cpu-0", None, None),
         _node("gpu-drained", "NVIDIA-L4", "0")]
CLASSES = [{"metadata": {"name": "gpu.nvidia.com"}}, {"metadata": {"name": "mig.nvidia.com"}}]


def test_the_default_workloads_fit_the_lab():
    fit = workloads.training_workloads_fit_problems
    assert fit(DEFAULTS["training_workloads_jobs"], NODES, CLASSES) == []


def test_jobs_no_node_can_run_are_named_by_the_input_the_user_wrote():
    fit = workloads.training_workloads_fit_problems
    jobs = [{"name": "a", "kind": "pytorch", "gpus": 9, "product": "NVIDIA-H100-80GB-HBM3"},
            {"name": "b", "kind": "pytorch", "gpus": 8, "product": "NVIDIA-H100-80GB-HBM3"},
            {"name": "c", "kind": "pytorch", "gpus": 1, "product": "NVIDIA-L4"},
            {"name": "d", "kind": "pytorch", "gpus": 1, "gpu_request": "claim", "device_class": "h100.nvidia.com"},
            {"name": "e", "kind": "pytorch", "gpus": 1, "gpu_request": "claim"}]
    assert fit(jobs, NODES, CLASSES, "extended-resource", "mig-typo.nvidia.com") == [
        "training_workloads_jobs[0].gpus=9: more than any node labelled nvidia.com/gpu.product='NVIDIA-H100-80GB-HBM3' "
        "can give one pod (largest: 8 nvidia.com/gpu allocatable on gpu-h100-0); allowed: at most 8 per pod (a "
        "pytorch-distributed job spreads more over several pods)",
        # A node of the product with none allocatable (drained of its GPUs) offers nothing.
        "training_workloads_jobs[2].product='NVIDIA-L4': no node labelled nvidia.com/gpu.product='NVIDIA-L4' has "
        "nvidia.com/gpu allocatable (products with it: NVIDIA-A100-SXM4-40GB, NVIDIA-H100-80GB-HBM3); allowed: one of "
        "those products",
        "training_workloads_jobs[3].device_class='h100.nvidia.com' names no DeviceClass of the cluster (it has: "
        "gpu.nvidia.com, mig.nvidia.com); allowed: one of those, or a class the DRA driver role creates "
        "(nvidia_dra_driver_product_classes) once it has run",
        # The job takes the role's default class: the message names the default's variable.
        "training_workloads_device_class='mig-typo.nvidia.com' names no DeviceClass of the cluster (it has: "
        "gpu.nvidia.com, mig.nvidia.com); allowed: one of those, or a class the DRA driver role creates "
        "(nvidia_dra_driver_product_classes) once it has run"]


def test_nothing_is_judged_without_nodes_or_without_the_dra_api():
    fit = workloads.training_workloads_fit_problems
    jobs = [{"name": "a", "kind": "pytorch", "gpus": 64, "product": "NVIDIA-H100-80GB-HBM3"},
            {"name": "d", "kind": "pytorch", "gpus": 1, "gpu_request": "claim", "device_class": "x.nvidia.com"}]
    assert fit(jobs, [], None) == []
    # A renamed resource (time-slicing's nvidia.com/gpu.shared) is counted under its own name.
    shared = [_node("n", "NVIDIA-H100-80GB-HBM3", None)]
    shared[0]["status"]["allocatable"]["nvidia.com/gpu.shared"] = "32"
    assert fit(jobs[:1], shared, None, gpu_resource="nvidia.com/gpu.shared") == [
        "training_workloads_jobs[0].gpus=64: more than any node labelled nvidia.com/gpu.product='NVIDIA-H100-80GB-HBM3' "
        "can give one pod (largest: 32 nvidia.com/gpu.shared allocatable on n); allowed: at most 32 per pod (a "
        "pytorch-distributed job spreads more over several pods)"]
