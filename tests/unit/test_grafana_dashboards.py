"""roles/grafana's dashboards checked as data: valid JSON models with unique uids and panel ids, every query parsed by
promtool's own PromQL parser, and every metric a query reads enabled by the DCGM exporter's counters file or written
by the drift runner (runner/gpu_ops_drift.py)."""

from __future__ import annotations

import json
import re
import subprocess

import yaml

import promql_names
from conftest import REPO_ROOT, load_filter_plugin, load_source, promtool_path

filters = load_filter_plugin("monitoring")
DASHBOARDS = {path.name: path.read_text() for path in sorted(
    (REPO_ROOT / "roles" / "grafana" / "files" / "dashboards").glob("*.json"))}
COUNTERS = [c["field"] for c in yaml.safe_load(
    (REPO_ROOT / "roles" / "dcgm_exporter" / "vars" / "main.yml").read_text())["_dcgm_exporter_default_counters"]]
load_source("gpu_ops_run", REPO_ROOT / "runner" / "gpu_ops_run.py")
DRIFT_METRICS = sorted(promql_names.drift_metric_names(
    load_source("gpu_ops_drift", REPO_ROOT / "runner" / "gpu_ops_drift.py")))


def all_queries() -> list[tuple[str, str, str]]:
    return [(name, where, expr) for name, text in DASHBOARDS.items()
            for where, expr in promql_names.dashboard_queries(json.loads(text))]


def test_the_shipped_dashboards_cover_cluster_node_workloads_and_drift():
    assert filters.grafana_dashboard_problems(DASHBOARDS) == []
    uids = {json.loads(text)["uid"] for text in DASHBOARDS.values()}
    assert uids == {"gpu-cluster", "gpu-node", "gpu-workloads", "gpu-drift"}
    assert len(all_queries()) >= 30


def test_the_drift_dashboard_reads_every_metric_the_drift_runner_writes():
    read = {metric for name, _, expr in all_queries() if name == "gpu-drift.json"
            for metric in promql_names.promql_metric_names(promql_names.grafana_substitute(expr))}
    assert read == set(DRIFT_METRICS)


def test_every_query_parses_with_promtool(tmp_path):
    """Each query (Grafana variables replaced by plain values) becomes a recording rule that promtool must accept."""
    queries = all_queries()
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"dashboard:query_{index}", "expr": promql_names.grafana_substitute(expr)}
        for index, (_, _, expr) in enumerate(queries)]}]}
    (tmp_path / "queries.yml").write_text(yaml.safe_dump(rules))
    result = subprocess.run([str(promtool_path()), "check", "rules", "queries.yml"], cwd=tmp_path,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


def test_a_broken_query_is_refused_by_promtool(tmp_path):
    rules = {"groups": [{"name": "d", "rules": [{"record": "x:y", "expr": "sum by (node (DCGM_FI_DEV_GPU_UTIL)"}]}]}
    (tmp_path / "bad.yml").write_text(yaml.safe_dump(rules))
    result = subprocess.run([str(promtool_path()), "check", "rules", "bad.yml"], cwd=tmp_path,
                            capture_output=True, text=True, check=False)
    assert result.returncode != 0


def test_every_metric_a_dashboard_reads_is_an_enabled_counter_or_a_drift_metric():
    assert promql_names.dashboard_metric_problems(DASHBOARDS, COUNTERS, DRIFT_METRICS) == []
    # ... and the check can fail: without FB_TOTAL enabled, the framebuffer panels are named.
    problems = promql_names.dashboard_metric_problems(
        DASHBOARDS, [c for c in COUNTERS if c != "DCGM_FI_DEV_FB_TOTAL"], DRIFT_METRICS)
    assert problems and all("DCGM_FI_DEV_FB_TOTAL" in p for p in problems)
    assert any("gpu-node.json panel 'Framebuffer used'" in p for p in problems)
    # A drift metric the runner does not write (a typo, or one it stopped writing) is named too.
    typo = json.loads(DASHBOARDS["gpu-drift.json"])
    typo["panels"][0]["targets"][0]["expr"] = "max by (result) (gpu_drift_last_result) == 1"
    assert promql_names.dashboard_metric_problems({"gpu-drift.json": typo}, COUNTERS, DRIFT_METRICS) == [
        "dashboard gpu-drift.json panel 'Last run result' target 0 reads gpu_drift_last_result, which the DCGM "
        "exporter's counters do not enable (nor does the drift runner write it)"]


def test_grafana_variables_are_replaced_before_parsing():
    assert promql_names.grafana_substitute('rate(x{node=~"$node", gpu=~"${gpu}"}[$__rate_interval])') == \
        'rate(x{node=~"x", gpu=~"x"}[5m])'
    queries = dict(((name, where), expr) for name, where, expr in all_queries())
    assert queries[("gpu-node.json", "variable 'node'")] == "DCGM_FI_DEV_GPU_TEMP"


def test_bad_dashboards_are_named():
    good = json.loads(DASHBOARDS["gpu-cluster.json"])
    no_query = dict(good, uid="other", panels=[{"id": 1, "type": "timeseries", "title": "Empty", "targets": []}])
    problems = filters.grafana_dashboard_problems({
        "a.json": "{not json",
        "b.json": json.dumps(good),
        "c.json": json.dumps(dict(good, title="Copy")),
        "d.json": json.dumps(no_query),
        "Bad Name.txt": json.dumps(dict(good, uid="third", title="")),
    })
    assert problems[0] == "dashboard file name 'Bad Name.txt'; allowed: lower-case letters, digits, '.', '_', '-', " \
                          "ending in .json"
    assert "dashboard Bad Name.txt title=''; allowed: a non-empty string" in problems
    assert any(p.startswith("dashboard a.json is not valid JSON") for p in problems)
    assert "dashboard c.json uid='gpu-cluster' repeats dashboard b.json" in problems
    assert "dashboard d.json panel 'Empty' has no Prometheus query (targets[].expr)" in problems
    assert filters.grafana_dashboard_problems({}) == [
        "grafana dashboards={}; allowed: a non-empty mapping of file name to dashboard JSON"]


# The DCGM exporter's violation counters count nanoseconds throttled (its counters file: "(in ns)"; the fixture
# tests/unit/fixtures/dcgm_exporter/default-counters.yml records it). A panel showing them as a share of time must
# read 0.25 when the GPU is held back a quarter of the time.
VIOLATION = re.compile(r"^DCGM_FI_DEV_\w+_VIOLATION$")


def violation_panels(dashboards: dict[str, str]) -> list[tuple[str, dict]]:
    return [(name, panel) for name, text in dashboards.items()
            for panel in promql_names.dashboard_panels(json.loads(text))
            if any(VIOLATION.match(metric) for target in panel.get("targets") or []
                   for metric in promql_names.promql_metric_names(target.get("expr") or ""))]


def share_cases(panels: list[tuple[str, dict]], share: float) -> dict:
    """promtool expression tests: every violation panel query, over counters in nanoseconds at `share` of the time
    (Grafana's variables as grafana_substitute fills them), must give that share."""
    labels = 'job="dcgm-exporter",node="x",gpu="x"'
    fields = sorted({metric for _, panel in panels for target in panel["targets"]
                     for metric in promql_names.promql_metric_names(target["expr"])})
    return {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": f"{field}{{{labels}}}", "values": "0+%dx20" % round(share * 60 * 1e9)}
                         for field in fields],
        "promql_expr_test": [{"expr": promql_names.grafana_substitute(target["expr"]), "eval_time": "15m",
                              "exp_samples": [{"labels": f"{{{labels}}}", "value": share}]}
                             for _, panel in panels for target in panel["targets"]]}]}


def run_share_cases(tmp_path, dashboards: dict[str, str]) -> subprocess.CompletedProcess:
    (tmp_path / "share.test.yml").write_text(yaml.safe_dump(share_cases(violation_panels(dashboards), 0.25)))
    return subprocess.run([str(promtool_path()), "test", "rules", "share.test.yml"], cwd=tmp_path,
                          capture_output=True, text=True, check=False)


def test_throttled_time_panels_show_the_share_of_time_from_counters_in_nanoseconds(tmp_path):
    panels = violation_panels(DASHBOARDS)
    assert [(name, panel["title"]) for name, panel in panels] == [("gpu-node.json", "Time throttled")]
    assert all(panel["fieldConfig"]["defaults"]["unit"] == "percentunit" for _, panel in panels)
    result = run_share_cases(tmp_path, DASHBOARDS)
    assert result.returncode == 0, result.stdout + result.stderr
    # ... and the check can fail: the panel reading the counters as microseconds shows 250 instead of 0.25.
    wrong = {"gpu-node.json": DASHBOARDS["gpu-node.json"].replace("/ 1e9", "/ 1e6")}
    result = run_share_cases(tmp_path, wrong)
    assert result.returncode != 0
    assert 'got: {gpu="x", job="dcgm-exporter", node="x"} 2.5E+02' in result.stdout + result.stderr


# The DCGM exporter's own host label: Hostname up to 4.5.3-4.8.2, hostname from 4.6.0-4.8.3 (NVIDIA/dcgm-exporter#655).
# A dashboard that groups, filters or names series by it shows nothing for exporters on the other side of the rename;
# the dashboards use `node` (Prometheus sets it from the exporter pod's node) and so serve both.
HOST_LABEL = re.compile(r"\b[Hh]ostname\b")


def host_label_uses(dashboards: dict[str, str]) -> list[str]:
    uses = [f"{name} {where}: {expr}" for name, text in dashboards.items()
            for where, expr in promql_names.dashboard_queries(json.loads(text)) if HOST_LABEL.search(expr)]
    uses += [f"{name} panel {panel.get('title')!r} legend: {target['legendFormat']}" for name, text in dashboards.items()
             for panel in promql_names.dashboard_panels(json.loads(text)) for target in panel.get("targets") or []
             if HOST_LABEL.search(target.get("legendFormat") or "")]
    return uses


def test_no_dashboard_depends_on_the_exporters_renamed_host_label():
    assert host_label_uses(DASHBOARDS) == []
    old = json.loads(DASHBOARDS["gpu-node.json"])
    target = promql_names.dashboard_panels(old)[0]["targets"][0]
    target["legendFormat"] = "{{Hostname}} GPU {{gpu}}"
    target["expr"] = target["expr"].replace("node=~", "Hostname=~")
    uses = host_label_uses({"gpu-node.json": json.dumps(old)})
    assert len(uses) == 2 and all("Hostname" in use for use in uses)
