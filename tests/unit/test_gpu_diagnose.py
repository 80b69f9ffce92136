"""The diagnose playbook's pure parts (plugins/module_utils/gpu_diagnose.py, the report and node modules, the role's
filters): each known failure signature is named from real messages (recorded in the upstream issue threads named
beside each sample), messages that are not it are not, secrets are redacted in text and in API objects, and the archive
holds the collected files and no secret."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from conftest import load_ansible_module, load_filter_plugin

from ansible_collections.gpu_ops.cluster.plugins.module_utils import gpu_diagnose, support_matrix
from ansible_collections.gpu_ops.cluster.plugins.module_utils.nvidia_gpu import CommandResult

report_module = load_ansible_module("gpu_diagnose_report")
node_module = load_ansible_module("gpu_diagnose_node")
filters = load_filter_plugin("gpu_diagnose")
validation_filters = load_filter_plugin("gpu_validation")

# (signature id, what it names, a real message as the component printed it, where it was recorded)
REAL_MESSAGES = [
    ("runtime_not_configured", "nvidia",
     'Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox runtime: no runtime for '
     '"nvidia" is configured', "NVIDIA/gpu-operator#730 (kubelet event FailedCreatePodSandBox)"),
    ("runtime_not_configured", "nvidia",
     "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox runtime: no runtime for "
     "\u201cnvidia\u201d is configured", "NVIDIA/gpu-operator#759 (the title, with typographic quotes)"),
    ("driver_library_mismatch", None, "Failed to initialize NVML: Driver/library version mismatch",
     "tests/unit/fixtures/nvidia_smi/error-version-mismatch.txt (intel/llvm#17614)"),
    ("insufficient_gpu", "nvidia.com/gpu",
     "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 3 No preemption "
     "victims found for incoming pod.", "kube-scheduler FailedScheduling"),
    ("insufficient_gpu", "nvidia.com/gpu.shared",
     "0/5 nodes are available: 2 Insufficient nvidia.com/gpu.shared, 3 node(s) didn't match Pod's node "
     "affinity/selector.", "kube-scheduler FailedScheduling, time-slicing renamed"),
    ("cdi_unresolvable", "management.nvidia.com/gpu=GPU-e78e68c0-4e6a-737e-f9cc-4223fe50aead",
     "Error: failed to create containerd task: failed to create shim task: OCI runtime create failed: could not apply "
     "required modification to OCI specification: error modifying OCI spec: failed to inject CDI devices: "
     "unresolvable CDI devices management.nvidia.com/gpu=GPU-e78e68c0-4e6a-737e-f9cc-4223fe50aead",
     "NVIDIA/nvidia-container-toolkit#1239 (kubelet event Failed)"),
    ("cdi_unresolvable", "k8s.gpu.nvidia.com/device=gpu-1",
     "Error: failed to create containerd container: CDI device injection failed: unresolvable CDI devices "
     "k8s.gpu.nvidia.com/device=gpu-1", "kubernetes-sigs/dra-driver-nvidia-gpu#736"),
    ("nvml_not_loaded", None,
     "2023-10-19T11:11:54.957723331+08:00 stderr F 2023/10/19 03:11:54 Failed to initialize NVML: could not load NVML "
     "library.", "NVIDIA/k8s-device-plugin#444 (container log)"),
    ("nvml_not_loaded", None,
     'W0819 07:02:54.757556       1 rm.go:109] NVML not detected: could not load NVML library: libnvidia-ml.so.1: '
     "cannot open shared object file: No such file or directory", "NVIDIA/k8s-device-plugin#1371"),
    ("pod_security", "restricted:latest",
     'Error creating: pods "train-abcde" is forbidden: violates PodSecurity "restricted:latest": privileged '
     '(container "cuda" must not set securityContext.privileged=true), allowPrivilegeEscalation != false',
     "kube-apiserver PodSecurity admission, through the Job controller's FailedCreate event"),
    ("quota_exceeded", "team-a-gpus",
     'Error creating: pods "train-abcde" is forbidden: exceeded quota: team-a-gpus, requested: '
     "requests.nvidia.com/gpu=2, used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=1",
     "kube-apiserver ResourceQuota admission"),
]


@pytest.mark.parametrize(("signature", "named", "message", "where"), REAL_MESSAGES,
                         ids=[f"{m[0]}-{i}" for i, m in enumerate(REAL_MESSAGES)])
def test_each_real_message_is_named_by_its_signature_only(signature, named, message, where):
    findings = gpu_diagnose.match_signatures([{"source": where, "text": "unrelated line\n" + message + "\n"}])
    assert [finding["id"] for finding in findings] == [signature]
    finding = findings[0]
    assert finding["cause"] and finding["fix"] and finding["sources"] == [where]
    assert finding["evidence"] == [{"source": where, "line": message[:gpu_diagnose.LINE_LIMIT]}]
    if named:
        assert finding["names"] == [named]


def test_every_signature_has_a_real_sample():
    assert {signature.id for signature in gpu_diagnose.SIGNATURES} == {m[0] for m in REAL_MESSAGES}


@pytest.mark.parametrize("message", [
    "I0819 07:02:54.756857       1 main.go:260] Starting Plugins.",
    "Successfully assigned team-a/train-0 to gpu-h100-0",
    "0/3 nodes are available: 3 Insufficient cpu.",
    "NVML version: 12.550.54.15",  # nvidia-smi -q's own line, no failure
    'pods "x" is forbidden: exceeded quota is not reached',  # no quota name after the colon
    "",
])
def test_healthy_or_unrelated_lines_name_nothing(message):
    assert gpu_diagnose.match_signatures([{"source": "x", "text": message}]) == []


def test_one_message_seen_in_many_places_is_one_finding_with_every_source_and_distinct_evidence():
    line = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    sources = [{"source": "event team-a/Pod/p%d" % i, "text": line} for i in range(3)]
    sources += [{"source": "pod team-a/p%d" % i, "text": "0/%d nodes are available: Insufficient nvidia.com/gpu" % i}
                for i in range(10)]
    (finding,) = gpu_diagnose.match_signatures(sources)
    assert finding["count"] == 13 and len(finding["sources"]) == 13
    assert len(finding["evidence"]) == gpu_diagnose.EVIDENCE_LIMIT
    assert finding["evidence"][0] == {"source": "event team-a/Pod/p0", "line": line}


def test_the_mismatch_is_not_also_called_nvml_not_loaded():
    text = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.144\n"
    assert [f["id"] for f in gpu_diagnose.match_signatures([{"source": "n", "text": text}])] == \
        ["driver_library_mismatch"]


# ---- redaction ---------------------------------------------------------------------------------------------------------

SECRET = "s3cr3t-Value-42"


@pytest.mark.parametrize("text", [
    # containerd's registry auth (config dump, TOML)
    '[plugins."io.containerd.grpc.v1.cri".registry.configs."nvcr.io".auth]\n  password = "%s"\n  username = "u"' % SECRET,
    '      auth = "%s"\n      identitytoken = "%s"' % (SECRET, SECRET),
    # env dumps and logs
    "GRAFANA_ADMIN_PASSWORD=%s" % SECRET, "NGC_API_KEY=%s kubelet started" % SECRET,
    "level=info msg=\"login\" token=%s" % SECRET, '{"client_secret": "%s"}' % SECRET,
    "Authorization: Bearer %s" % SECRET, "pulling from https://robot:%s@registry.example.com/v2/" % SECRET,
    "AWS_SECRET_ACCESS_KEY: %s" % SECRET,
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA%s\n-----END RSA PRIVATE KEY-----" % SECRET,
])
def test_secrets_in_configs_logs_and_env_are_redacted(text):
    redacted = gpu_diagnose.redact_text(text)
    assert SECRET not in redacted and gpu_diagnose.REDACTED in redacted, redacted


def test_a_jwt_is_redacted_anywhere():
    jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJlLXZhbHVl"
    assert jwt not in gpu_diagnose.redact_text("using service account token %s for the API" % jwt)


@pytest.mark.parametrize("text", [
    'username = "u"\n  password = ""',  # an empty value hides nothing: kept, so a person sees it is empty
    "key: nvidia.com/gpu", "secretName: grafana-admin", "authorization-mode: Node,RBAC",
    "Failed to initialize NVML: Driver/library version mismatch",
    'pods "x" is forbidden: exceeded quota: gpu, requested: requests.nvidia.com/gpu=2',
])
def test_what_is_no_secret_stays(text):
    assert gpu_diagnose.redact_text(text) == text


def test_api_objects_lose_their_secrets_and_keep_the_rest():
    pod = {"kind": "Pod", "metadata": {"name": "grafana", "annotations": {"note": "password=%s" % SECRET}},
           "spec": {"containers": [{"name": "grafana", "env": [
               {"name": "GF_SECURITY_ADMIN_PASSWORD", "value": SECRET},
               {"name": "GF_LOG_LEVEL", "value": "info"},
               {"name": "TOKEN_FROM", "valueFrom": {"secretKeyRef": {"name": "grafana", "key": "token"}}}]}],
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                    "volumes": [{"name": "admin", "secret": {"secretName": "grafana-admin"}}]}}
    secret = {"kind": "Secret", "metadata": {"name": "s"}, "data": {"password": "czNjcjN0"}, "type": "Opaque"}
    redacted = gpu_diagnose.redact_data({"pods": [pod], "secrets": [secret]})
    assert SECRET not in json.dumps(redacted) and "czNjcjN0" not in json.dumps(redacted)
    env = redacted["pods"][0]["spec"]["containers"][0]["env"]
    assert env[0]["value"] == gpu_diagnose.REDACTED and env[1]["value"] == "info"
    assert env[2]["valueFrom"]["secretKeyRef"] == {"name": "grafana", "key": "token"}
    assert redacted["pods"][0]["spec"]["tolerations"] == pod["spec"]["tolerations"]
    assert redacted["pods"][0]["spec"]["volumes"] == pod["spec"]["volumes"]
    assert redacted["secrets"][0]["data"] == {"password": gpu_diagnose.REDACTED}


# ---- the cluster view ---------------------------------------------------------------------------------------------------

def _pod(name, namespace="team-a", gpus=None, phase="Pending", condition=None, waiting=None):
    resources = {"limits": {"nvidia.com/gpu": gpus}} if gpus else {}
    status = {"phase": phase, "conditions": [condition] if condition else []}
    if waiting:
        status["containerStatuses"] = [{"name": "c", "ready": False, "restartCount": 3,
                                        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": waiting}}}]
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "c", "resources": resources}]}, "status": status}


def test_the_cluster_view_keeps_gpu_nodes_pending_gpu_pods_and_gpu_quotas_only():
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}
    cluster = {
        "nodes": [{"metadata": {"name": "gpu-h100-0", "labels": {}},
                   "status": {"capacity": {"cpu": "64", "nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
                              "conditions": [{"type": "Ready", "status": "True"}]},
                   "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}},
                  {"metadata": {"name": "labelled", "labels": {"nvidia.com/gpu.present": "true"}}, "status": {}},
                  {"metadata": {"name": "cpu-0", "labels": {}}, "status": {"capacity": {"cpu": "8"}}}],
        "pending_pods": [_pod("gpu-job", gpus=1, condition=unschedulable), _pod("cpu-job")],
        "resource_quotas": [
            {"metadata": {"name": "gpus", "namespace": "team-a"},
             "status": {"hard": {"requests.nvidia.com/gpu": "1", "pods": "10"},
                        "used": {"requests.nvidia.com/gpu": "1", "pods": "2"}}},
            {"metadata": {"name": "objects", "namespace": "team-a"}, "status": {"hard": {"pods": "10"}}}],
        "device_plugin_pods": [_pod("nvdp-x", "nvidia-device-plugin", phase="Running",
                                    waiting="back-off 5m0s restarting failed container")],
    }
    view = gpu_diagnose.cluster_view(cluster, "nvidia.com/gpu.present=true", ["inventory-only"])
    assert [node["name"] for node in view["gpu_nodes"]] == ["gpu-h100-0", "labelled"]
    assert view["gpu_nodes"][0]["capacity"] == {"nvidia.com/gpu": "8"}
    assert view["gpu_nodes"][0]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert [pod["pod"] for pod in view["pending_gpu_pods"]] == ["team-a/gpu-job"]
    assert view["gpu_quotas"] == [{"quota": "team-a/gpus", "hard": {"requests.nvidia.com/gpu": "1"},
                                   "used": {"requests.nvidia.com/gpu": "1"}, "exhausted": ["requests.nvidia.com/gpu"]}]
    sources = gpu_diagnose.cluster_sources(view, {"nvidia-device-plugin/nvdp-x/c": "Failed to initialize NVML: could "
                                                                                   "not load NVML library."})
    ids = [finding["id"] for finding in gpu_diagnose.match_signatures(sources)]
    assert ids == ["insufficient_gpu", "nvml_not_loaded"]


# ---- the report and its archive -----------------------------------------------------------------------------------------

def _collected():
    nodes = {
        "gpu-h100-0": {"facts": {"error_kind": None, "problems": [], "gpu_count": 8},
                       "files": {"nvidia-smi.txt": "$ nvidia-smi\n(exit 0)\n| NVIDIA-SMI 535.261.03 |\n",
                                 "containerd-config-dump.toml": '[plugins."io.containerd.grpc.v1.cri".registry.configs.'
                                                                '"nvcr.io".auth]\n  password = "%s"\n' % SECRET}},
        "gpu-h100-1": {"facts": {"error_kind": "version_mismatch", "problems": ["version mismatch"],
                                 "error": "Failed to initialize NVML: Driver/library version mismatch NVML library "
                                          "version: 550.144"},
                       "files": {"nvidia-smi.txt": "$ nvidia-smi\n(exit 18)\nFailed to initialize NVML: Driver/library "
                                                   "version mismatch\nNVML library version: 550.144\n",
                                 "journal/kubelet.txt": "Dec 06 kubelet[1]: token=%s\n" % SECRET}},
    }
    cluster = {"nodes": [], "events": [{"involvedObject": {"kind": "Pod", "namespace": "team-a", "name": "p"},
                                        "reason": "FailedCreatePodSandBox", "source": {"component": "kubelet"},
                                        "message": 'failed to get sandbox runtime: no runtime for "nvidia" is configured'}],
               "pending_pods": [{"kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"}, "spec": {
                   "containers": [{"name": "c", "env": [{"name": "HF_TOKEN", "value": SECRET}],
                                   "resources": {"limits": {"nvidia.com/gpu": 1}}}]}, "status": {"phase": "Pending"}}]}
    return {"nodes": nodes, "inventory_nodes": ["gpu-h100-0", "gpu-h100-1", "gpu-a100-0"], "cluster": cluster,
            "logs": {"nvidia-device-plugin/nvdp-x/nvidia-device-plugin": "I0101 Starting\n"},
            "gpu_node_selector": "nvidia.com/gpu.present=true"}


def test_the_archive_holds_every_collected_file_the_report_and_no_secret(tmp_path: Path):
    params = dict(_collected(), report_dir=str(tmp_path / "reports"))
    result = report_module.write_report(params, 1796570000.0)
    assert [f["id"] for f in result["findings"]] == ["runtime_not_configured", "driver_library_mismatch"]
    assert "gpu-a100-0: not collected (unreachable or failed before the GPU facts)" in result["observations"]
    assert result["archive"] == str(tmp_path / "reports" / "diagnose-20261206T151320Z.tar.gz")
    with tarfile.open(result["archive"]) as archive:
        names = archive.getnames()
        texts = {name: archive.extractfile(name).read().decode() for name in names}
    top = "diagnose-20261206T151320Z/"
    for expected in ("nodes/gpu-h100-0/nvidia-smi.txt", "nodes/gpu-h100-0/containerd-config-dump.toml",
                     "nodes/gpu-h100-0/nvidia_gpu_facts.json", "nodes/gpu-h100-1/journal/kubelet.txt",
                     "cluster/nodes.json", "cluster/events.json", "cluster/pending_pods.json",
                     "cluster/resource_quotas.json", "cluster/gpu-view.json", "diagnose.json", "diagnose.txt",
                     "cluster/logs/nvidia-device-plugin_nvdp-x_nvidia-device-plugin.log"):
        assert top + expected in names, (expected, names)
    assert not [name for name, text in texts.items() if SECRET in text]
    assert gpu_diagnose.REDACTED in texts[top + "nodes/gpu-h100-0/containerd-config-dump.toml"]
    report = json.loads((tmp_path / "reports" / "diagnose.json").read_text())
    assert report["archive"] == result["archive"] and SECRET not in json.dumps(report)
    summary = (tmp_path / "reports" / "diagnose.txt").read_text()
    assert summary == result["summary"] and "[driver_library_mismatch]" in summary and "cause: " in summary
    assert not list((tmp_path / "reports").glob("*.part"))


def test_a_healthy_collection_names_nothing(tmp_path: Path):
    params = {"nodes": {"gpu-h100-0": {"facts": {"problems": []}, "files": {"nvidia-smi.txt": "(exit 0)\n"}}},
              "inventory_nodes": ["gpu-h100-0"], "cluster": {"nodes": []}, "logs": {}, "gpu_node_selector": "",
              "report_dir": str(tmp_path)}
    result = report_module.write_report(params, 0.0)
    assert result["findings"] == [] and result["observations"] == []
    assert "no known failure signature found" in result["summary"]


def test_a_cluster_that_could_not_be_read_is_an_observation(tmp_path: Path):
    built = report_module.build({"cluster": {"error": "connection refused"}, "nodes": {}}, "2026-12-06T15:13:20Z")
    assert built["report"]["observations"] == ["cluster: not read: connection refused"]


def test_a_driver_past_its_branchs_end_is_noted_with_the_validation_reports_line(tmp_path: Path):
    facts = {"problems": [], "driver_version": "535.261.03"}
    params = {"nodes": {"gpu-h100-0": {"facts": facts}, "gpu-h100-1": {"facts": dict(facts, driver_version="580.95.05")}},
              "inventory_nodes": ["gpu-h100-0", "gpu-h100-1"], "cluster": {"nodes": []}, "logs": {},
              "gpu_node_selector": "", "report_dir": str(tmp_path)}
    result = report_module.write_report(params, 1796570000.0)  # 2026-12-06
    day = support_matrix.parse_day("2026-12-06")
    line = "gpu-h100-0: driver 535.261.03: " + support_matrix.driver_branch_eol_warning("535.261.03", day)
    assert result["observations"] == [line] and result["findings"] == []
    assert "note: " + line in result["summary"]
    assert line in validation_filters.gpu_validation_report({"gpu-h100-0": facts}, {}, {}, "2026-12-06")["warnings"]
    # On a day before the branch's end the same collection notes nothing.
    assert report_module.write_report(params, 1782000000.0)["observations"] == []  # 2026-06-21


# ---- the node module ----------------------------------------------------------------------------------------------------

def test_the_node_collection_records_failing_and_missing_commands_and_reads_cdi_specs(tmp_path: Path, monkeypatch):
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    calls = []

    def runner(argv, timeout):
        calls.append(argv)
        if argv[0] == "nvidia-smi":
            return CommandResult(18, "Failed to initialize NVML: Driver/library version mismatch\n", "")
        return CommandResult(0, "ok\n", "")

    monkeypatch.setattr(node_module.shutil, "which", lambda name: None if name == "modinfo" else "/usr/bin/" + name)
    monkeypatch.setattr(node_module, "CONTAINER_LOGS", str(tmp_path / "containers"))
    (tmp_path / "containers").mkdir()
    (tmp_path / "containers" / "nvdp-x_nvidia-device-plugin_nvidia-device-plugin-1.log").write_text(
        "".join("line %d\n" % i for i in range(10)))
    (tmp_path / "containers" / "other_default_app-1.log").write_text("not collected\n")
    files = node_module.collect({"timeout": 5, "line_count": 3, "cdi_dirs": [str(cdi), str(tmp_path / "none")],
                                 "journal_units": ["containerd"], "container_log_names": ["nvidia-device-plugin"]},
                                runner)
    assert files["nvidia-smi.txt"].startswith("$ nvidia-smi\n(exit 18)\nFailed to initialize NVML")
    assert "(not installed: modinfo is not on PATH)" in files["driver-versions.txt"]
    assert files["cdi/%s" % node_module.safe_name(str(cdi / "nvidia.yaml"))].startswith("cdiVersion")
    assert "no CDI spec in" in files["cdi/%s.txt" % node_module.safe_name(str(tmp_path / "none"))]
    assert files["container-logs/nvdp-x_nvidia-device-plugin_nvidia-device-plugin-1.log"] == "line 7\nline 8\nline 9\n"
    assert not [name for name in files if "other_default" in name]
    assert ["containerd", "config", "dump"] in calls
    assert ["journalctl", "--no-pager", "-o", "short-iso", "-n", "3", "-u", "containerd"] in calls


# ---- the role's filters -------------------------------------------------------------------------------------------------

def test_log_targets_and_texts():
    pods = [{"metadata": {"namespace": "nvidia-device-plugin", "name": "nvdp-x"},
             "spec": {"initContainers": [{"name": "init"}], "containers": [{"name": "plugin"}, {"name": "gfd"}]}}]
    targets = filters.gpu_diagnose_log_targets(pods)
    assert [t["container"] for t in targets] == ["init", "plugin", "gfd"]
    results = [{"__gpu_diagnose_log": targets[0], "log": "started\n"},
               {"__gpu_diagnose_log": targets[1], "failed": True, "msg": "dial tcp 10.0.0.1:10250: connect: refused"},
               {"__gpu_diagnose_log": targets[2], "skipped": True}]
    assert filters.gpu_diagnose_log_texts(results) == {
        "nvidia-device-plugin/nvdp-x/init": "started\n",
        "nvidia-device-plugin/nvdp-x/plugin": "(log not read: dial tcp 10.0.0.1:10250: connect: refused)\n"}
