"""roles/prometheus: its configuration and GPU alert rules, judged by promtool (check config, check rules, test rules
with a firing and a quiet case per alert), every metric they read enabled by the DCGM exporter, and bad settings
named by the preflight filter."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

import promql_names
from conftest import REPO_ROOT, load_filter_plugin, load_source, promtool_path, render_role_template

filters = load_filter_plugin("monitoring")
TESTS = REPO_ROOT / "tests" / "unit" / "data" / "prometheus" / "gpu-alerts.test.yml"
EXPECTED = {"gpu-h100-0": 8, "gpu-a100-0": 4}
COUNTERS = [c["field"] for c in yaml.safe_load(
    (REPO_ROOT / "roles" / "dcgm_exporter" / "vars" / "main.yml").read_text())["_dcgm_exporter_default_counters"]]
# The metric names the drift runner writes.
load_source("gpu_ops_run", REPO_ROOT / "runner" / "gpu_ops_run.py")
DRIFT_METRICS = promql_names.drift_metric_names(load_source("gpu_ops_drift", REPO_ROOT / "runner" / "gpu_ops_drift.py"))
DEFAULTS = yaml.safe_load((REPO_ROOT / "roles" / "prometheus" / "defaults" / "main.yml").read_text())


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run([str(promtool_path()), *args], cwd=cwd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


def render_rules(**overrides) -> str:
    # The role's vars compute this with the collection's filter, which a bare templar cannot resolve by FQCN.
    stale = filters.prometheus_duration_seconds(overrides.get("prometheus_alert_drift_stale_after",
                                                              DEFAULTS["prometheus_alert_drift_stale_after"]))
    return render_role_template("prometheus", "gpu-alerts.yml.j2", **{"prometheus_expected_gpus": EXPECTED,
                                                                        "_prometheus_drift_stale_after_seconds": stale,
                                                                        **overrides})


def alerts(rules_text: str) -> dict[str, dict]:
    return {rule["alert"]: rule for group in yaml.safe_load(rules_text)["groups"] for rule in group["rules"]
            if "alert" in rule}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    """The configuration and rules as the role renders them, in one directory (rules where the config finds them)."""
    work = tmp_path_factory.mktemp("prometheus")
    rules = render_rules()
    (work / "rules").mkdir()
    (work / "rules" / "gpu-alerts.yml").write_text(rules)
    (work / "prometheus.yml").write_text(render_role_template(
        "prometheus", "prometheus.yml.j2", _prometheus_rules_path=str(work / "rules"),
        prometheus_external_labels={"cluster": "gpu-lab"}))
    # The unit-test copy: annotations stripped, so the cases compare labels (promtool compares both).
    (work / "gpu-alerts.yml").write_text(strip_annotations(rules))
    (work / "gpu-alerts.test.yml").write_text(TESTS.read_text())
    return work


def test_promtool_accepts_the_configuration_and_its_rules(rendered):
    result = promtool("check", "config", "prometheus.yml", cwd=rendered)
    assert "SUCCESS" in result.stdout and "rules/gpu-alerts.yml" in result.stdout
    config = yaml.safe_load((rendered / "prometheus.yml").read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "dcgm-exporter")
    assert job["kubernetes_sd_configs"] == [{"role": "endpointslice", "namespaces": {"names": ["gpu-monitoring"]}}]
    assert {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"} in job["relabel_configs"]
    assert config["global"]["external_labels"] == {"cluster": "gpu-lab"}


def test_promtool_checks_the_rules_with_their_annotation_templates(rendered):
    result = promtool("check", "rules", "rules/gpu-alerts.yml", cwd=rendered)
    assert f"SUCCESS: {len(alerts(render_rules())) + len(EXPECTED)} rules found" in result.stdout


def test_every_alert_fires_in_one_case_and_stays_quiet_in_another(rendered):
    promtool("test", "rules", "gpu-alerts.test.yml", cwd=rendered)
    cases = [case for test in yaml.safe_load(TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    firing = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    names = set(alerts(render_rules()))
    assert names - firing == set(), "alerts without a firing case"
    assert names - quiet == set(), "alerts without a quiet case"
    assert {"GPUXid48", "GPUXid63", "GPUXid64", "GPUXid79", "GPUEccDoubleBitError", "GPUTemperatureHigh",
            "GPUTemperatureCritical", "GPUThermalThrottling", "GPUPowerThrottling", "GPUMissing",
            "DCGMExporterDown", "DCGMExporterAbsent"} <= names


def test_a_broken_case_fails_promtool(rendered, tmp_path):
    """The test above can fail: a case expecting XID 48 on the wrong GPU makes promtool exit non-zero."""
    for name in ("gpu-alerts.yml", "gpu-alerts.test.yml"):
        (tmp_path / name).write_text((rendered / name).read_text())
    tests = yaml.safe_load(TESTS.read_text())
    tests["tests"][0]["alert_rule_test"][1]["exp_alerts"][0]["exp_labels"]["gpu"] = "5"
    (tmp_path / "gpu-alerts.test.yml").write_text(yaml.safe_dump(tests))
    result = subprocess.run([str(promtool_path()), "test", "rules", "gpu-alerts.test.yml"], cwd=tmp_path,
                            capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "GPUXid48" in result.stdout + result.stderr


def test_every_metric_the_rules_read_is_an_enabled_counter():
    rules = yaml.safe_load(render_rules())
    read = {m for group in rules["groups"] for rule in group["rules"] for m in promql_names.promql_metric_names(rule["expr"])}
    recorded = {rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule}
    # The drift alerts read what runner/gpu_ops_drift.py writes: every such metric is one it writes.
    assert read - set(COUNTERS) - recorded - {"up"} == {m for m in read if m.startswith("gpu_drift_")}
    assert {m for m in read if m.startswith("gpu_drift_")} <= DRIFT_METRICS


def test_thresholds_flow_into_the_rules_and_no_inventory_drops_gpu_missing():
    rules = alerts(render_rules(prometheus_alert_temperature_warning=70, prometheus_alert_throttle_ratio=0.25,
                                prometheus_alert_exporter_down_for="2m", prometheus_expected_gpus={}))
    assert rules["GPUTemperatureHigh"]["expr"] == "DCGM_FI_DEV_GPU_TEMP >= 70"
    assert rules["GPUThermalThrottling"]["expr"].endswith("> 0.25")
    assert rules["DCGMExporterDown"]["for"] == "2m"
    assert "GPUMissing" not in rules


def strip_annotations(rules_text: str) -> str:
    rules = yaml.safe_load(rules_text)
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return yaml.safe_dump(rules)


def throttle_cases(ratio: float) -> dict:
    """promtool cases for the throttling alerts at one prometheus_alert_throttle_ratio, the counters in nanoseconds as
    the exporter reports them: a share of the time just over the ratio fires; just under it and 0.01 % stay quiet."""
    shares = {"0": ratio * 1.04, "1": ratio * 0.96, "2": 0.0001}
    series = [{"series": f'{field}{{job="dcgm-exporter",node="n1",gpu="{gpu}"}}',
               "values": "0+%dx20" % round(share * 60 * 1e9)}  # nanoseconds throttled per minute
              for field in ("DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_POWER_VIOLATION")
              for gpu, share in shares.items()]
    firing = [{"exp_labels": {"severity": "warning", "job": "dcgm-exporter", "node": "n1", "gpu": "0"}}]
    return {"rule_files": ["gpu-alerts.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [{"alertname": alert, "eval_time": "15m", "exp_alerts": firing}
                            for alert in ("GPUThermalThrottling", "GPUPowerThrottling")]}]}


def test_throttling_fires_at_the_configured_share_of_counters_in_nanoseconds(tmp_path):
    ratio = 0.25
    rules = render_rules(prometheus_alert_throttle_ratio=ratio)
    (tmp_path / "gpu-alerts.yml").write_text(strip_annotations(rules))
    (tmp_path / "gpu-alerts.test.yml").write_text(yaml.safe_dump(throttle_cases(ratio)))
    promtool("test", "rules", "gpu-alerts.test.yml", cwd=tmp_path)
    # The cases can fail: rules that read the counters as microseconds (rate / 1e6) fire under the ratio too.
    assert "/ 1e9 > 0.25" in rules
    (tmp_path / "gpu-alerts.yml").write_text(strip_annotations(rules.replace("/ 1e9 >", "/ 1e6 >")))
    result = subprocess.run([str(promtool_path()), "test", "rules", "gpu-alerts.test.yml"], cwd=tmp_path,
                            capture_output=True, text=True, check=False)
    assert result.returncode != 0 and 'gpu="1"' in result.stdout + result.stderr


@pytest.mark.parametrize("expr, names", [
    ('sum by (node) (rate(DCGM_FI_DEV_POWER_VIOLATION{node=~"$node"}[5m])) / 1e9', ["DCGM_FI_DEV_POWER_VIOLATION"]),
    ("up{job=\"dcgm-exporter\"} == 1 unless on (node) count by (node) (DCGM_FI_DEV_GPU_TEMP)",
     ["DCGM_FI_DEV_GPU_TEMP", "up"]),
    ('label_replace(vector(8), "node", "a", "", "")', []),
    ('{__name__="DCGM_FI_DEV_FB_USED"} / 0x10 offset 5m', ["DCGM_FI_DEV_FB_USED"]),
    ("avg_over_time(gpu:node_expected_gpus[1h:5m]) > bool inf", ["gpu:node_expected_gpus"]),
])
def test_metric_names_of_an_expression(expr, names):
    assert promql_names.promql_metric_names(expr) == names


def test_the_defaults_pass_and_bad_settings_are_named():
    assert filters.prometheus_setting_problems(DEFAULTS) == []
    bad = dict(DEFAULTS, prometheus_retention_time="15 days", prometheus_retention_size="50G",
               prometheus_storage_size="-5Gi", prometheus_alert_temperature_warning=95,
               prometheus_alert_throttle_ratio=0, prometheus_expected_gpus={"Node_1": 0},
               prometheus_scrape_interval="0", prometheus_external_labels={"bad-label": "x"})
    assert filters.prometheus_setting_problems(bad) == [
        "prometheus_retention_time='15 days'; allowed: a Prometheus duration such as 15d, 12h, 30s or 1h30m",
        "prometheus_scrape_interval='0'; allowed: a Prometheus duration such as 15d, 12h, 30s or 1h30m",
        "prometheus_retention_size='50G'; allowed: \"\" (no size limit) or a size such as 512MB or 50GB",
        "prometheus_storage_size='-5Gi'; allowed: \"\" (emptyDir) or a Kubernetes quantity above 0 such as 50Gi or 1.5Ti",
        "prometheus_alert_temperature_warning=95 is not below prometheus_alert_temperature_critical=90; "
        "allowed: warning < critical",
        "prometheus_alert_throttle_ratio=0; allowed: a number in (0, 1]: the share of time throttled",
        "prometheus_expected_gpus key 'Node_1'; allowed: a Kubernetes node name",
        "prometheus_expected_gpus['Node_1']=0; allowed: a positive integer",
        "prometheus_external_labels={'bad-label': 'x'}; allowed: a mapping whose keys are Prometheus label names "
        "([a-zA-Z_][a-zA-Z0-9_]*)",
    ]


@pytest.mark.parametrize(("duration", "seconds"), [("3h", 10800), ("1h30m", 5400), ("2d", 172800), ("500ms", 0.5),
                                                    ("1w", 604800)])
def test_prometheus_durations_in_seconds(duration, seconds):
    assert filters.prometheus_duration_seconds(duration) == seconds


@pytest.mark.parametrize("bad", ["", "0", "3 hours", "1m1h", 10800])
def test_a_bad_duration_is_named(bad):
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError) as refused:
        filters.prometheus_duration_seconds(bad)
    assert repr(bad) in str(refused.value)


def test_drift_targets_must_be_host_and_port():
    settings = {**DEFAULTS, "prometheus_expected_gpus": {}, "prometheus_drift_metrics_targets": ["control-1:9100", "ctl"]}
    assert filters.prometheus_setting_problems(settings) == [
        "prometheus_drift_metrics_targets[1]='ctl'; allowed: host:port with a port 1-65535, such as control-1:9100"]


def test_the_drift_scrape_job_appears_only_with_targets_and_promtool_accepts_it(tmp_path):
    (tmp_path / "rules").mkdir()

    def config(**overrides) -> dict:
        text = render_role_template("prometheus", "prometheus.yml.j2", _prometheus_rules_path=str(tmp_path / "rules"),
                                    **overrides)
        (tmp_path / "prometheus.yml").write_text(text)
        promtool("check", "config", "prometheus.yml", cwd=tmp_path)
        return yaml.safe_load(text)

    assert "gpu-drift" not in {job["job_name"] for job in config()["scrape_configs"]}
    (job,) = [j for j in config(prometheus_drift_metrics_targets=["control-1:9100"])["scrape_configs"]
              if j["job_name"] == "gpu-drift"]
    assert job["static_configs"] == [{"targets": ["control-1:9100"]}] and job["honor_labels"] is True
