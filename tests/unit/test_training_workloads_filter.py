"""plugins/filter/training_workloads.py: the training_workloads role's preflight check."""

from __future__ import annotations

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
