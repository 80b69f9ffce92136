"""plugins/modules/gpu_prometheus_health.py and module_utils/gpu_dcgm_health.py: a real Prometheus (Debian's, as
`labctl promtool` unpacks it) scrapes a DOUBLE of the DCGM exporter (a local HTTP server serving series in the
exporter's format and labels), and the module's queries name each node's faulty GPUs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from ansible_collections.gpu_ops.cluster.plugins.module_utils import gpu_dcgm_health as dcgm
from conftest import REPO_ROOT, render_role_template

sys.path.insert(0, str(REPO_ROOT / "lab"))
from dcgm_exporter_double import (  # noqa: E402
    ExporterDouble, LocalPrometheus, Series, exposition, free_port, throttled)

SERIES = [
    Series("DCGM_FI_DEV_XID_ERRORS", "gpu-h100-0", 3, 79),
    # gpu-h100-1's exporter is older than 4.6.0-4.8.3: its host label is still Hostname (the others': hostname).
    Series("DCGM_FI_DEV_XID_ERRORS", "gpu-h100-1", 0, 13, host_label="Hostname"),  # the application's: no problem
    Series("DCGM_FI_DEV_XID_ERRORS", "gpu-h100-1", 1, 0, host_label="Hostname"),
    Series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "gpu-a100-0", 0, 2, "NVIDIA A100-SXM4-40GB"),
    Series("DCGM_FI_DEV_RETIRED_PENDING", "gpu-a100-0", 0, 0, "NVIDIA A100-SXM4-40GB"),
    Series("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gpu-a100-0", 0, 0, "NVIDIA A100-SXM4-40GB"),
]
# GPU 1 of gpu-h100-0 held back by thermal limits a quarter of the time: its counter grows in nanoseconds.
THROTTLED = throttled("DCGM_FI_DEV_THERMAL_VIOLATION", "gpu-h100-0", 1, 0.25)
# A series without the node label (an exporter Prometheus did not relabel) cannot be tied to a node.
UNLABELLED = 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="1",UUID="GPU-x",Hostname="dcgm-exporter-z"} 5\n'


@pytest.fixture(scope="module")
def prometheus():
    with ExporterDouble() as exporter, LocalPrometheus(exporter.target) as server:
        exporter.set_series(SERIES + [THROTTLED], extra=UNLABELLED)
        server.wait_for("DCGM_FI_DEV_XID_ERRORS")
        yield server


def run_module(args: dict) -> dict:
    done = subprocess.run([sys.executable, "-m", "ansible_collections.gpu_ops.cluster.plugins.modules.gpu_prometheus_health"],
                          input=json.dumps({"ANSIBLE_MODULE_ARGS": args}), capture_output=True, text=True, check=False,
                          timeout=120)
    return json.loads(done.stdout)


def test_the_module_names_each_nodes_faulty_gpus_from_a_real_prometheus(prometheus):
    result = run_module({"url": prometheus.url})
    assert result["error"] == "" and not result.get("failed"), result
    assert result["problems"] == {
        "gpu-a100-0": ["GPU 0 (GPU-gpu-a100-0-0): the DCGM exporter reports uncorrected ECC errors since the driver "
                       "loaded (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL = 2)"],
        "gpu-h100-0": ["GPU 3 (GPU-gpu-h100-0-3): the DCGM exporter reports Xid 79 (GPU has fallen off the bus)"],
    }
    # The exporter's own host label, in either form (renamed Hostname -> hostname in 4.6.0-4.8.3), finds the nodes
    # of exporters on both sides of the rename.
    for host_label in ("hostname", "Hostname"):
        by_host = run_module({"url": prometheus.url, "node_label": host_label, "xid_ignore": []})["problems"]
        assert by_host["dcgm-exporter-gpu-h100-1"] == ["GPU 0 (GPU-gpu-h100-1-0): the DCGM exporter reports Xid 13"]
        assert by_host["dcgm-exporter-gpu-h100-0"] == [
            "GPU 3 (GPU-gpu-h100-0-3): the DCGM exporter reports Xid 79 (GPU has fallen off the bus)"]
        assert by_host["dcgm-exporter-z"] == [
            "GPU 1 (GPU-x): the DCGM exporter reports uncorrected ECC errors since the driver loaded "
            "(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL = 5)"]


def test_a_prometheus_that_cannot_be_asked_is_reported_not_failed():
    result = run_module({"url": "http://127.0.0.1:%d" % free_port(), "timeout": 2})
    assert not result.get("failed") and result["problems"] == {} and result["error"].startswith("cannot ask")
    bad = run_module({"url": "prometheus:9090"})
    assert bad["failed"] and bad["msg"] == "url='prometheus:9090'; allowed: http://host:port or https://host:port"


def test_the_exporters_host_label_is_read_in_both_forms_and_other_labels_as_named():
    new, old = {"hostname": "a", "node": "n1"}, {"Hostname": "b"}
    assert [dcgm.node_of(new, "hostname"), dcgm.node_of(old, "hostname")] == ["a", "b"]
    assert [dcgm.node_of(new, "Hostname"), dcgm.node_of(old, "Hostname")] == ["a", "b"]
    assert [dcgm.node_of(new, "node"), dcgm.node_of(old, "node"), dcgm.node_of(new, "NODE")] == ["n1", None, None]


def test_series_without_a_value_above_zero_are_no_problem():
    assert dcgm.series_problems("DCGM_FI_DEV_RETIRED_PENDING", "pages pending retirement",
                                [{"metric": {"node": "n", "gpu": "0"}, "value": [0, "0"]},
                                 {"metric": {"node": "n", "gpu": "1"}, "value": [0, "NaN"]}], "node") == {}


def test_the_throttling_rule_reads_the_doubles_nanoseconds_as_the_share_of_time(prometheus):
    """The alert rule's own expression (the part before its threshold), asked of a real Prometheus scraping the
    exporter double's violation counter in nanoseconds, gives the share of time throttled: 0.25, not 250."""
    rule = next(rule for group in yaml.safe_load(render_role_template(
        "prometheus", "gpu-alerts.yml.j2", prometheus_expected_gpus={}, _prometheus_drift_stale_after_seconds=10800))[
            "groups"] for rule in group["rules"] if rule.get("alert") == "GPUThermalThrottling")
    share, threshold = rule["expr"].rsplit(" > ", 1)
    assert float(threshold) == 0.1 and "[5m]" in share
    # rate() divides by its whole window: over the few seconds this Prometheus has scraped, a 4 s window, asked once
    # it holds four scrapes (one a second).
    short = share.replace("[5m]", "[4s]")
    (found,) = prometheus.wait_for(f"({short}) and count_over_time({THROTTLED.field}[4s]) >= 4")
    assert found["metric"]["node"] == "gpu-h100-0" and found["metric"]["gpu"] == "1"
    # 0.25 within the extrapolation error of a window of a few scrapes; microseconds would read 250.
    assert 0.2 < float(found["value"][1]) < 0.3, found
    (line,) = [line for line in exposition([THROTTLED], elapsed=2.0).splitlines()
               if line.startswith(THROTTLED.field + "{")]
    assert line.endswith("} 500000000")  # 2 s at a quarter: 0.5 s, in nanoseconds
