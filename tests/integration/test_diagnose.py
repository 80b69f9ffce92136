"""The diagnose playbook on the lab (issue 19, docs/diagnose.md): a healthy lab reports nothing wrong and nothing
changes; with every known failure injected at once (they do not interfere), a check-mode run names each one in its
summary and JSON report, changes nothing either, and the archive holds the expected files and none of the secrets
planted in a pod's env and a container log.

How each failure is made on the lab:
- driver/library version mismatch: the nvidia-smi double's fault (`labctl fault --version-mismatch`) on gpu-h100-1;
- Insufficient nvidia.com/gpu: a real kube-scheduler refusal of a pod asking for 64 GPUs;
- exceeded quota and violates PodSecurity: the real API server's admission refusals of Jobs' pods (the Job controller
  reports them as FailedCreate events), in a namespace with a GPU ResourceQuota and one enforcing `restricted`;
- no runtime for "nvidia" and unresolvable CDI devices: kwok runs no container, so the test posts the kubelet's
  Warning events for them (wording recorded in NVIDIA/gpu-operator#730 and NVIDIA/nvidia-container-toolkit#1239);
- the device plugin failing to load NVML: its container log as the kubelet writes it on the node
  (/var/log/containers/..., CRI format), with the plugin's recorded lines (NVIDIA/k8s-device-plugin#444).
Everything is removed again at the end (the nodes' description files restored byte for byte, the log file deleted,
the namespaces deleted by the fixture), so later tests in the lane see the lab as it was.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import pytest

import nodes
from conftest import ROOT, Lab, recap_changed, run_playbook, wait_for

LAB_INVENTORY = "inventories/lab/hosts.yml"
NODES = ("gpu-a100-0", "gpu-h100-0", "gpu-h100-1")
SECRET = "diag-s3cret-" + uuid.uuid4().hex[:12]
DESCRIPTION = "/etc/gpu-lab/gpus.json"
PLUGIN_LOG = ("/var/log/containers/nvidia-device-plugin-diag1_nvidia-device-plugin_nvidia-device-plugin-ctr-"
              + "0" * 64 + ".log")
SIGNATURES = ["runtime_not_configured", "driver_library_mismatch", "insufficient_gpu", "cdi_unresolvable",
              "nvml_not_loaded", "pod_security", "quota_exceeded"]


def labctl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    return subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "lab/labctl.py", *args], cwd=ROOT, env=env,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800, check=False)


def podman(*args: str, input_text: str | None = None) -> str:
    result = subprocess.run(["podman", *args], input=input_text, text=True, capture_output=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def diagnose(lab: Lab, report_dir: Path, *extra: str) -> tuple[int, str, dict]:
    rc, output = run_playbook(lab, "diagnose.yml", "-i", LAB_INVENTORY, "-e", f"gpu_diagnose_report_dir={report_dir}",
                              *extra)
    report = report_dir / "diagnose.json"
    return rc, output, json.loads(report.read_text()) if report.exists() else {}


def changed_anywhere(output: str) -> dict[str, int]:
    return {host: recap_changed(output, host) for host in ("localhost", *NODES)}


def archive_texts(path: str) -> dict[str, str]:
    with tarfile.open(path) as archive:
        return {name.split("/", 1)[1]: archive.extractfile(name).read().decode("utf-8", "replace")
                for name in archive.getnames()}


@pytest.fixture(scope="module")
def hosts(lab: Lab) -> Iterator[None]:
    had = set(nodes.container_states())
    if not set(NODES) <= had:
        up = labctl("up")
        assert up.returncode == 0, up.stdout[-3000:]
    yield
    if not set(NODES) <= had and not os.environ.get("GPU_LAB_KEEP"):
        nodes.down()


def test_a_healthy_lab_reports_nothing_wrong_and_nothing_changes(lab: Lab, hosts, tmp_path: Path):
    rc, output, report = diagnose(lab, tmp_path)
    assert rc == 0, output[-4000:]
    assert changed_anywhere(output) == {host: 0 for host in ("localhost", *NODES)}, output[-3000:]
    assert report["findings"] == [], json.dumps(report["findings"])[:3000]
    # The lab installs Debian's own driver (535 or 550, both past their end of life): the only notes are the
    # lifecycle warnings, one per node at most, each naming its node and its running driver.
    eol = re.compile(r"^(?P<node>[\w.-]+): driver (?P<driver>[0-9.]+): driver branch (?P<branch>[0-9]+) (\([a-z -]+\) "
                     r"reached its end of life in \w+ [0-9]{4}|is older than every branch NVIDIA still supports): ")
    matches = [eol.match(note) for note in report["observations"]]
    assert all(matches), report["observations"]
    assert len({match["node"] for match in matches}) == len(matches) and {m["node"] for m in matches} <= set(NODES)
    assert all(match["driver"].split(".")[0] == match["branch"] for match in matches), report["observations"]
    assert "no known failure signature found" in output
    assert sorted(report["nodes_collected"]) == sorted(NODES)
    # The cluster part: the GPU nodes with what they advertise, the device plugin's pods.
    gpu_nodes = {node["name"]: node for node in report["cluster"]["gpu_nodes"]}
    assert set(NODES) <= set(gpu_nodes) and all(gpu_nodes[name]["allocatable"] for name in NODES)
    texts = archive_texts(report["archive"])
    for name in NODES:
        for file_name in ("nvidia-smi.txt", "nvidia_gpu_facts.json", "driver-versions.txt",
                          "containerd-config-dump.toml", "journal/containerd.txt", "journal/kubelet.txt"):
            assert f"nodes/{name}/{file_name}" in texts, (name, file_name, sorted(texts))
        assert "(exit 0)" in texts[f"nodes/{name}/nvidia-smi.txt"]
        assert "io.containerd" in texts[f"nodes/{name}/containerd-config-dump.toml"]
    assert json.loads(texts["cluster/device_plugin_pods.json"]), "the device plugin's pods were not read"
    assert [name for name in texts if name.startswith("cluster/logs/nvidia-device-plugin_")], sorted(texts)
    for key in ("nodes", "pending_pods", "events", "resource_quotas", "runtime_classes", "gpu-view"):
        assert f"cluster/{key}.json" in texts


def _gpu_pod(name: str, gpus: int, privileged: bool = False, env: list | None = None) -> dict:
    container = {"name": "cuda", "image": "nvcr.io/nvidia/cuda:12.5.0-base-ubuntu22.04",
                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}, "env": env or []}
    if privileged:
        container["securityContext"] = {"privileged": True}
    return {"metadata": {"name": name}, "spec": {"containers": [container], "restartPolicy": "Never",
                                                 "tolerations": [{"operator": "Exists"}]}}


def _job(name: str, gpus: int, privileged: bool = False) -> dict:
    pod = _gpu_pod(name, gpus, privileged)
    return {"metadata": {"name": name}, "spec": {"backoffLimit": 0, "template": {"spec": pod["spec"]}}}


def _kubelet_event(lab: Lab, namespace: str, pod: str, reason: str, message: str) -> None:
    now = datetime.now(timezone.utc)
    lab.core.create_namespaced_event(namespace, {
        "metadata": {"name": f"{pod}.{uuid.uuid4().hex[:10]}"}, "type": "Warning", "reason": reason,
        "message": message, "count": 1, "firstTimestamp": now, "lastTimestamp": now,
        "source": {"component": "kubelet", "host": "gpu-h100-0"},
        "involvedObject": {"kind": "Pod", "namespace": namespace, "name": pod, "apiVersion": "v1"}})


def _events(lab: Lab, namespace: str, reason: str) -> list[str]:
    return [event.message for event in lab.core.list_namespaced_event(namespace).items if event.reason == reason]


def test_every_injected_failure_is_named_in_check_mode_with_nothing_changed_and_no_secret(lab: Lab, hosts, namespace,
                                                                                         tmp_path: Path):
    descriptions = {name: podman("exec", name, "cat", DESCRIPTION) for name in NODES}
    try:
        # On the nodes: a driver upgraded without a reboot; the device plugin's container log on gpu-h100-0.
        assert labctl("fault", "gpu-h100-1", "--version-mismatch", "550.144").returncode == 0
        smi = subprocess.run(["podman", "exec", "gpu-h100-1", "nvidia-smi", "-L"], capture_output=True, text=True,
                             timeout=60, check=False)
        assert smi.returncode == 18, ("the node's nvidia-smi double predates the version mismatch fault: "
                                      "`labctl up` installs the current one", smi.stdout, smi.stderr)
        log_lines = ["2026-12-06T13:00:00.000000001+00:00 stderr F 2026/12/06 13:00:00 Loading NVML",
                     "2026-12-06T13:00:00.000000002+00:00 stderr F 2026/12/06 13:00:00 Failed to initialize NVML: "
                     "could not load NVML library.",
                     f"2026-12-06T13:00:00.000000003+00:00 stderr F 2026/12/06 13:00:00 using NGC_API_KEY={SECRET}"]
        podman("exec", "-i", "gpu-h100-0", "sh", "-c", f"mkdir -p /var/log/containers && cat > {PLUGIN_LOG}",
               input_text="\n".join(log_lines) + "\n")

        # In the cluster: a pod no node can take (with a secret in its env), the kubelet's runtime and CDI failures.
        team = namespace()
        lab.core.create_namespaced_pod(team, _gpu_pod("train-64", 64, env=[{"name": "HF_TOKEN", "value": SECRET}]))
        _kubelet_event(lab, team, "train-64", "FailedCreatePodSandBox",
                       'Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox runtime: '
                       'no runtime for "nvidia" is configured')
        _kubelet_event(lab, team, "train-64", "Failed",
                       "Error: failed to create containerd container: CDI device injection failed: unresolvable CDI "
                       "devices nvidia.com/gpu=all")
        # A team whose GPU quota is smaller than its Job's request; a restricted namespace and a privileged GPU Job.
        quota_team = namespace()
        lab.core.create_namespaced_resource_quota(quota_team, {"metadata": {"name": "gpus"},
                                                               "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}})
        wait_for(lambda: (lab.core.read_namespaced_resource_quota("gpus", quota_team).status.hard or {}), 30,
                 "the quota's status")
        restricted = namespace({"pod-security.kubernetes.io/enforce": "restricted"})
        from kubernetes import client
        batch = client.BatchV1Api(lab.api_client)
        batch.create_namespaced_job(quota_team, _job("train-2", 2))
        batch.create_namespaced_job(restricted, _job("train-privileged", 1, privileged=True))
        wait_for(lambda: any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in
                             lab.core.read_namespaced_pod("train-64", team).status.conditions or []), 60,
                 "the scheduler's refusal of the 64-GPU pod")
        wait_for(lambda: _events(lab, quota_team, "FailedCreate"), 60, "the Job controller's quota refusal")
        wait_for(lambda: _events(lab, restricted, "FailedCreate"), 60, "the Job controller's Pod Security refusal")

        # The healthy run above read the pod logs (kwok has none to give: each is recorded as not read); this one
        # skips them to stay quick.
        rc, output, report = diagnose(lab, tmp_path, "--check", "-e", '{"gpu_diagnose_pod_logs": false}')
        assert rc == 0, output[-4000:]
        assert changed_anywhere(output) == {host: 0 for host in ("localhost", *NODES)}, output[-3000:]
        assert [finding["id"] for finding in report["findings"]] == SIGNATURES, json.dumps(report["findings"])[:4000]
        findings = {finding["id"]: finding for finding in report["findings"]}
        for signature in SIGNATURES:
            assert f"[{signature}]" in output, signature  # the summary the run shows
        assert findings["driver_library_mismatch"]["sources"][0].startswith("node gpu-h100-1: ")
        assert any(s.startswith("node gpu-h100-0: container-logs/") for s in findings["nvml_not_loaded"]["sources"])
        assert findings["quota_exceeded"]["names"] == ["gpus"]
        assert findings["pod_security"]["names"] == ["restricted:latest"]
        assert findings["insufficient_gpu"]["names"] == ["nvidia.com/gpu"]
        assert findings["runtime_not_configured"]["names"] == ["nvidia"]
        assert any("gpu-h100-1" in note for note in report["observations"])  # the facts module's verdict
        assert [pod["pod"] for pod in report["cluster"]["pending_gpu_pods"]] == [f"{team}/train-64"]

        texts = archive_texts(report["archive"])
        assert "Driver/library version mismatch" in texts["nodes/gpu-h100-1/nvidia-smi.txt"]
        assert f"nodes/gpu-h100-0/container-logs/{PLUGIN_LOG.rsplit('/', 1)[1]}" in texts
        leaked = [name for name, text in texts.items() if SECRET in text]
        assert leaked == [], leaked
        assert "<redacted>" in texts["cluster/pending_pods.json"]
        assert not [path.name for path in tmp_path.iterdir() if SECRET in path.read_text(errors="replace")
                    and path.is_file() and not path.name.endswith(".gz")]
    finally:
        podman("exec", "gpu-h100-0", "rm", "-f", PLUGIN_LOG)
        for name, text in descriptions.items():
            podman("exec", "-i", name, "sh", "-c", f"cat > {DESCRIPTION}", input_text=text)
    assert re.match(r"^GPU 0: ", podman("exec", "gpu-h100-1", "nvidia-smi", "-L"))
