"""bench/dra_latency.py's pods, claim templates and figures: both modes ask for the same GPUs, one way each."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "lab"))

import dra_latency  # noqa: E402


def test_the_two_modes_ask_for_the_same_gpus_one_way_each():
    extended = dra_latency.pod("a", "extended-resource", 4)
    claim = dra_latency.pod("b", "claim", 4)
    resources = extended["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"nvidia.com/gpu": "4"} and resources["requests"]["nvidia.com/gpu"] == "4"
    assert "resourceClaims" not in extended["spec"]
    claimed = claim["spec"]["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in claimed["requests"] and "limits" not in claimed
    assert claimed["claims"] == [{"name": "gpus"}]
    assert claim["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "gpus-4"}]
    assert extended["spec"]["nodeSelector"] != claim["spec"]["nodeSelector"]


def test_a_claim_template_asks_for_exactly_the_count_of_the_driver_class():
    template = dra_latency.claim_template(8)
    assert template["apiVersion"] == "resource.k8s.io/v1" and template["metadata"]["name"] == "gpus-8"
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"] == {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 8}


def test_the_bench_lab_splits_its_gpu_nodes_evenly():
    config = dra_latency.bench_config(1000, 2000)
    counts = {pool.prefix: pool.count for pool in config.pools}
    assert counts == {"bench-dp": 450, "bench-dra": 450, "bench-cpu": 100}
    assert all(pool.gpu.count == 8 for pool in config.pools[:2]) and config.pools[2].gpu is None


def test_quantiles():
    assert dra_latency.quantiles([float(value) for value in range(1, 101)]) == (50.5, 95.0, 100.0)
    assert dra_latency.quantiles([3.0]) == (3.0, 3.0, 3.0)
