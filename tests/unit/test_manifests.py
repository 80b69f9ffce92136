"""The cluster roles' manifests, rendered by Ansible with each role's defaults (tests/render/render_manifests.yml):
valid against the Kubernetes 1.37 schemas (kubernetes-validate, strict), and scanned by checkov. Both run in the tools'
virtualenv (.venv-scan): kubernetes.core imports kubernetes-validate on every module run wherever it is installed, so
the project's .venv, which runs the playbooks, does not have it.

checkov must find nothing on the tenancy role's objects; every other finding must be an exception listed, with its
reason, in the table of docs/tenancy.md ("Scanner exceptions"), and every listed exception must still be found (a
fixed finding leaves no stale exception behind).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT

CHECKOV = REPO_ROOT / ".venv-scan" / "bin" / "checkov"
SCAN_PYTHON = REPO_ROOT / ".venv-scan" / "bin" / "python"
# Reads [[name, document], ...] as JSON on stdin; prints the problems found, one string each, as JSON.
VALIDATE = """
import json, sys
import kubernetes_validate
problems = []
for name, doc in json.load(sys.stdin):
    try:
        kubernetes_validate.validate(doc, "1.37", strict=True)
    except kubernetes_validate.ValidationError as error:
        problems.append(f"{name} {doc['kind']}/{doc['metadata']['name']}: {error.message} at {list(error.path)}")
print(json.dumps(problems))
"""
DOC = REPO_ROOT / "docs" / "tenancy.md"
# Custom resources have no schema in kubernetes-validate (their CRD is not Kubernetes').
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("manifests")
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    result = subprocess.run([str(REPO_ROOT / ".venv" / "bin" / "ansible-playbook"), "tests/render/render_manifests.yml",
                             "-e", f"render_dest={dest}"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                            check=False, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return dest


def documents(root: Path) -> list[tuple[str, dict]]:
    found = []
    for path in sorted(root.glob("*/*.yaml")):
        found.extend((f"{path.parent.name}/{path.name}", doc) for doc in yaml.safe_load_all(path.read_text()) if doc)
    return found


def test_every_role_and_template_is_rendered(rendered: Path):
    roles = {path.parent.name for path in rendered.glob("*/*.yaml")}
    assert roles == {"gpu_scheduling", "nvidia_device_plugin", "nvidia_dra_driver", "dcgm_exporter", "prometheus",
                     "grafana", "tenancy", "training_workloads", "drift_schedule"}
    kinds = {doc["kind"] for _, doc in documents(rendered)}
    assert {"Namespace", "Role", "RoleBinding", "ResourceQuota", "LimitRange", "NetworkPolicy", "Job", "Service",
            "DaemonSet", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "RuntimeClass", "Deployment",
            "PrometheusRule", "PersistentVolumeClaim", "CronJob", "ClusterRole", "Secret", "DeviceClass"} <= kinds


def schema_problems(named_documents: list) -> list[str]:
    """kubernetes-validate's verdict on each (name, document), strict, for Kubernetes 1.37."""
    result = subprocess.run([str(SCAN_PYTHON), "-c", VALIDATE], input=json.dumps(named_documents), capture_output=True,
                            text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_manifests_are_valid_kubernetes_1_37(rendered: Path):
    problems = schema_problems([(name, doc) for name, doc in documents(rendered) if doc["kind"] not in CUSTOM_KINDS])
    assert not problems, "\n".join(problems)


def test_validation_can_fail():
    """The validator is not a rubber stamp: a typo in a field is refused."""
    bad = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q"}, "spec": {"hadr": {"pods": "1"}}}
    (problem,) = schema_problems([("bad.yaml", bad)])
    assert problem.startswith("bad.yaml ResourceQuota/q: ") and "hadr" in problem, problem


def test_the_playbooks_virtualenv_does_not_have_it():
    """kubernetes.core imports kubernetes-validate on every module run when it can (gather_versions): about 0.08 s of
    CPU per k8s task on the controller."""
    result = subprocess.run([str(REPO_ROOT / ".venv" / "bin" / "python"), "-c", "import kubernetes_validate"],
                            capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode != 0 and "No module named 'kubernetes_validate'" in result.stderr, result


def documented_exceptions() -> dict[tuple[str, str], str]:
    """{(check id, resource): reason} from the table under '## Scanner exceptions' in docs/tenancy.md."""
    section = DOC.read_text().split("## Scanner exceptions", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (CKV\w+) \| `([^`]+)` \| (.+?) \|$", section, re.MULTILINE)
    return {(check, resource): reason for check, resource, reason in rows}


def checkov_failures(root: Path) -> set[tuple[str, str]]:
    if not CHECKOV.exists():
        pytest.fail(f"{CHECKOV} is missing: run `make scan-tools` (checkov in its own virtualenv)")
    result = subprocess.run([str(CHECKOV), "-d", str(root), "--framework", "kubernetes", "-o", "json", "--quiet"],
                            capture_output=True, text=True, check=False, timeout=600)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    return {(check["check_id"], check["resource"]) for report in reports
            for check in report.get("results", {}).get("failed_checks", [])}


def test_checkov_finds_only_documented_exceptions(rendered: Path):
    found = checkov_failures(rendered)
    exceptions = documented_exceptions()
    assert exceptions, "no exception table found in docs/tenancy.md"
    tenant = {(check, resource) for check, resource in found
              if resource.startswith(("Namespace.team-sample", "Role.team-sample.", "RoleBinding.team-sample.",
                                      "ResourceQuota.", "LimitRange.", "NetworkPolicy.", "ValidatingAdmissionPolicy"))}
    assert not tenant, f"findings on tenancy objects: {sorted(tenant)}"
    assert not found - set(exceptions), f"undocumented findings: {sorted(found - set(exceptions))}"
    assert not set(exceptions) - found, f"documented exceptions no longer found: {sorted(set(exceptions) - found)}"


def test_checkov_can_fail(tmp_path: Path):
    """A privileged pod in the tenants' shape is flagged: the scan really runs the checks."""
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "pod.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad", "namespace": "team-sample"},
        "spec": {"containers": [{"name": "c", "image": "x:1", "securityContext": {"privileged": True}}]}}))
    assert ("CKV_K8S_16", "Pod.team-sample.bad") in checkov_failures(tmp_path)


def test_a_job_asking_through_a_claim_names_its_template_and_no_extended_resource(rendered: Path):
    """The render's pytorch-resnet-4gpu asks through a claim (tests/render/render_manifests.yml): a
    resource.k8s.io/v1 ResourceClaimTemplate for exactly its 4 GPUs, the pod naming it, the container the claim, and no
    nvidia.com/gpu; the other jobs keep the extended resource and have no template."""
    templates = [doc for name, doc in documents(rendered) if name == "training_workloads/claim-templates.yaml"]
    assert [t["metadata"]["name"] for t in templates] == ["pytorch-resnet-4gpu"]
    template = templates[0]
    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert template["metadata"]["labels"]["app.kubernetes.io/part-of"] == "training-workloads"
    assert template["spec"]["spec"]["devices"]["requests"] == [{"name": "gpus", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 4,
        "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == "
                                             "'NVIDIA H100 80GB HBM3'"}}]}}]
    jobs = {doc["metadata"]["name"]: doc for name, doc in documents(rendered) if doc["kind"] == "Job"
            and name.startswith("training_workloads/")}
    claimed = jobs["pytorch-resnet-4gpu"]["spec"]["template"]["spec"]
    assert claimed["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "pytorch-resnet-4gpu"}]
    resources = claimed["containers"][0]["resources"]
    assert resources["claims"] == [{"name": "gpus"}] and "nvidia.com/gpu" not in resources["limits"]
    for name in ("tf-mnist-1gpu", "pytorch-resnet-1gpu", "pytorch-ddp"):
        spec = jobs[name]["spec"]["template"]["spec"]
        assert "resourceClaims" not in spec and "claims" not in spec["containers"][0]["resources"]
        assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] in ("1", "4")


def test_the_mig_role_reads_the_device_plugin_daemonset_the_role_renders(rendered: Path):
    """The nvidia_mig role's agreement check (module_utils/device_plugin_config.served_mig_strategies) on the device
    plugin role's own DaemonSet and ConfigMap with its defaults: a node it deploys to gets the default config
    (DEFAULT_CONFIG, migStrategy none), a node labelled for another config gets that one, and others none at all."""
    from ansible_collections.gpu_ops.cluster.plugins.module_utils.device_plugin_config import served_mig_strategies

    objects = [doc for name, doc in documents(rendered) if name.startswith("nvidia_device_plugin/")]
    daemonsets = [d for d in objects if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "nvidia-device-plugin"]
    config_maps = [d for d in objects if d["kind"] == "ConfigMap"]
    assert len(daemonsets) == 1 and config_maps
    deploy = {"nvidia.com/gpu.deploy.device-plugin": "true"}
    served = served_mig_strategies("gpu-0", deploy, daemonsets, config_maps)
    assert [(s.get("strategy"), s.get("error")) for s in served] == [("none", None)], served
    assert "key default, chosen by DEFAULT_CONFIG" in served[0]["source"]
    config_maps[0]["data"]["mig"] = "version: v1\nflags: {migStrategy: mixed}\n"
    labelled = {**deploy, "nvidia.com/device-plugin.config": "mig"}
    assert served_mig_strategies("gpu-0", labelled, daemonsets, config_maps)[0]["strategy"] == "mixed"
    assert served_mig_strategies("cpu-0", {}, daemonsets, config_maps) == []
