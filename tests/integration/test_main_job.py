"""The main job, end to end, as `make lab` runs it: the whole lab (control plane, simulated nodes, the node containers
and the package mirror on the lab network), `playbooks/site.yml` over all of it, the closing summary, and a check run
right after that must find nothing to change.

The node containers are the only hosts in the suite that install from the mirror by name over the lab network, so a
machine whose podman cannot resolve container names (the CNI backend without DNS) fails here, as the main job would.
The module runs after every other integration test but the lifecycle one (conftest.py orders them): it leaves the lab
provisioned, as `make lab` does; node containers it had to create are removed at the end unless GPU_LAB_KEEP=1.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest

from conftest import ROOT, Lab, playbook_env

sys.path.insert(0, str(ROOT / "lab"))

import nodes  # noqa: E402

SITE_TIMEOUT_S = 2400
# What a check run right after site.yml may still report as changed: validation's own work (its smoke Job is run
# again each time, its report is rewritten with the new run's time), never a node or a cluster object of the stack.
VALIDATION_ROLE = "gpu_ops.cluster.gpu_validation : "


def lab_env(tmp: Path, name: str, record_dir: Path) -> dict[str, str]:
    return {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
            "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}",
            "ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "tests" / "plugins" / "callback"),
            "ANSIBLE_CALLBACKS_ENABLED": "gpu_ops.cluster.run_record,gpu_ops.cluster.preload,change_log",
            "GPU_CHANGE_LOG": str(tmp / f"{name}.changes.jsonl"),
            "GPU_RUN_RECORD": str(record_dir / "site-run.json"), "GPU_RUN_LOG": str(record_dir / "site.log")}


def run_site(tmp: Path, name: str, *args: str, record_dir: Path) -> dict:
    """site.yml as `make lab` runs it; returns rc, output, the run record and the changed tasks per host."""
    record_dir.mkdir(parents=True, exist_ok=True)
    env = lab_env(tmp, name, record_dir)
    result = subprocess.run(["ansible-playbook", "playbooks/site.yml", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=SITE_TIMEOUT_S, check=False)
    Path(env["GPU_RUN_LOG"]).write_text(result.stdout, encoding="utf-8")
    changes: dict[str, list[str]] = {}
    for line in Path(env["GPU_CHANGE_LOG"]).read_text(encoding="utf-8").splitlines():
        for host, tasks in json.loads(line)["changed"].items():
            changes.setdefault(host, []).extend(tasks)
    record_path = Path(env["GPU_RUN_RECORD"])
    record = json.loads(record_path.read_text(encoding="utf-8")) if record_path.exists() else {}
    return {"rc": result.returncode, "output": result.stdout, "record": record, "changes": changes}


def labctl(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    return subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "lab/labctl.py", *args], cwd=ROOT, env=env,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def main_job(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("main-job")
    had_nodes = set(nodes.container_states())
    up = labctl("up")
    assert up.returncode == 0, up.stdout[-4000:]
    # Where `make lab` keeps them, so `labctl summary` reads this run's record.
    site = run_site(tmp, "site", record_dir=ROOT / "reports")
    summary = labctl("summary", timeout=300)
    check = drift = None
    if site["rc"] == 0:
        # The two read-only checks of the converged lab, side by side (lane 1 is CI's long pole): site.yml in check
        # mode, and the drift runner's detect-only run (drift.yml in check mode, through ansible-runner). The drift
        # run keeps a fact cache of its own: Ansible's jsonfile cache is written in place, and a run reading a file
        # the other is writing would fail on it.
        with ThreadPoolExecutor(max_workers=2) as pool:
            checking = pool.submit(run_site, tmp, "check", "--check", record_dir=tmp)
            detecting = pool.submit(drift_run, tmp / "after-site", "--detect-only",
                                    env={"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp / "drift-facts")})
            check, drift = checking.result(), detecting.result()
    yield {"up": up, "site": site, "summary": summary, "check": check, "drift": drift}
    if not had_nodes and not os.environ.get("GPU_LAB_KEEP"):
        nodes.down()


def podman(*args: str) -> str:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=True, timeout=120).stdout


def test_lab_network_resolves_the_mirror_from_every_node(main_job: dict, lab: Lab) -> None:
    assert podman("info", "--format", "{{.Host.NetworkBackend}}").strip() == "netavark"
    (network,) = json.loads(podman("network", "inspect", nodes.NETWORK))
    assert network["dns_enabled"] is True
    for name in lab.config.host_nodes():
        resolved = subprocess.run(["podman", "exec", name, "getent", "hosts", nodes.MIRROR_SERVER],
                                  capture_output=True, text=True, check=False, timeout=60)
        assert resolved.returncode == 0 and resolved.stdout.split(), f"{name}: {resolved.stderr or 'no address'}"
    assert "every node container resolves and reaches http://gpu-lab-mirror:8080/" in main_job["up"].stdout


def test_site_provisions_and_validates_every_node(main_job: dict, lab: Lab) -> None:
    site = main_job["site"]
    assert site["rc"] == 0, site["output"][-6000:]
    record = site["record"]
    assert record["status"] == "ok"
    hosts = set(lab.config.host_nodes())
    assert hosts | {"localhost"} <= set(record["hosts"])
    assert all(record["hosts"][host]["state"] == "ok" for host in hosts | {"localhost"}), record["hosts"]
    report = json.loads((ROOT / "reports" / "nodes.json").read_text(encoding="utf-8"))
    assert set(report) == hosts
    for host in hosts:
        assert report[host]["nvidia_driver"]["managed"]["held"] is True, report[host]
        assert report[host]["cuda_toolkit"]["default_version"], report[host]
        assert "containerd" in report[host]["nvidia_container_toolkit"]["runtimes"], report[host]


def test_summary_shows_every_node_and_the_verdict(main_job: dict, lab: Lab) -> None:
    summary = main_job["summary"]
    assert summary.returncode == 0, summary.stdout[-3000:]
    text = summary.stdout
    for host in lab.config.host_nodes():
        row = next((line for line in text.splitlines() if line.startswith(host + " ")), "")
        assert re.search(r"\bReady\b", row) and "healthy" in row, f"{host}: {row!r}\n{text[-3000:]}"
    assert re.search(r"^validation: PASSED", text, re.MULTILINE), text[-3000:]


def test_check_right_after_site_changes_nothing(main_job: dict) -> None:
    check = main_job["check"]
    assert check is not None, "site.yml failed: nothing to check"
    assert check["rc"] == 0, check["output"][-6000:]
    drift = {host: [task for task in tasks if not task.startswith(VALIDATION_ROLE)]
             for host, tasks in check["changes"].items()}
    assert {host: tasks for host, tasks in drift.items() if tasks} == {}, check["output"][-6000:]


# --- Drift correction on the converged lab (runner/gpu_ops_drift.py, docs/drift.md) -----------------------------------

DRIFT_SCHEMA = json.loads((ROOT / "docs" / "drift-report.schema.json").read_text(encoding="utf-8"))


def drift_run(tmp: Path, *args: str, policy: dict | None = None,
              env: dict[str, str] | None = None) -> tuple[int, dict, str]:
    """The drift runner as a scheduler starts it; (exit code, the run's report, output)."""
    argv = [str(ROOT / ".venv" / "bin" / "python"), "runner/gpu_ops_drift.py", "check", "-i", "inventories/lab",
            "--reports", str(tmp / "drift"), *args]
    if policy is not None:
        argv += ["--extravars", json.dumps(policy)]
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}", **(env or {})}
    done = subprocess.run(argv, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=SITE_TIMEOUT_S, check=False)
    latest = tmp / "drift" / "latest.json"
    report = json.loads(latest.read_text(encoding="utf-8")) if latest.exists() else {}
    if report:
        import jsonschema

        jsonschema.validate(report, DRIFT_SCHEMA)
    return done.returncode, report, done.stdout


def kubectl(lab: Lab, *args: str) -> str:
    return subprocess.run(["kubectl", "--kubeconfig", str(lab.kubeconfig), *args], capture_output=True, text=True,
                          check=True, timeout=120).stdout


def node_sh(name: str, script: str) -> str:
    return subprocess.run(["podman", "exec", name, "sh", "-c", script], capture_output=True, text=True, check=True,
                          timeout=120).stdout


def test_drift_right_after_site_finds_nothing_and_nothing_unverifiable(main_job: dict) -> None:
    assert main_job["drift"] is not None, "site.yml failed: no converged lab to check"
    rc, report, output = main_job["drift"]
    assert rc == 0, output[-6000:]
    assert report["result"] == "in_sync" and report["items"] == [], report["items"]
    assert report["unverifiable"] == [] and report["unreachable"] == [], report
    assert set(report["hosts"]) == {"localhost", "gpu-h100-0", "gpu-h100-1", "gpu-a100-0"}


def service_account_kubeconfig(lab: Lab, namespace: str, name: str, path: Path) -> Path:
    """A kubeconfig with the lab's API server and CA and a fresh token of the service account (TokenRequest)."""
    import yaml

    admin = yaml.safe_load(lab.kubeconfig.read_text(encoding="utf-8"))
    token = kubectl(lab, "-n", namespace, "create", "token", name, "--duration", "1h").strip()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": admin["clusters"],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": admin["clusters"][0]["name"], "user": name}}],
        "current-context": name}), encoding="utf-8")
    path.chmod(0o600)
    return path


def test_the_cronjob_service_account_can_check_the_converged_cluster(main_job: dict, lab: Lab, tmp_path: Path) -> None:
    """The drift CronJob's RBAC (roles/drift_schedule) is enough for a whole cluster-side check: run with its token
    instead of the admin's, the check finds the converged lab in sync (a missing verb would fail a task)."""
    assert main_job["site"]["rc"] == 0, "site.yml failed: no converged lab to check"
    pod_inventory = tmp_path / "pod-inventory.yml"
    pod_inventory.write_text(json.dumps({"all": {"children": {"cluster_control": {"hosts": {"localhost": {}}}}}}))
    schedule = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "playbooks/drift_schedule.yml", "-e", json.dumps({
            "drift_schedule_method": "cronjob", "drift_schedule_inventories": [str(pod_inventory)]})],
        cwd=ROOT, env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600, check=False)
    try:
        assert schedule.returncode == 0, schedule.stdout[-4000:]
        kubeconfig = service_account_kubeconfig(lab, "gpu-drift", "gpu-drift", tmp_path / "sa.kubeconfig")
        rc, report, output = drift_run(tmp_path, "--detect-only", "--limit", "cluster_control",
                                       policy={"gpu_cluster_kubeconfig": str(kubeconfig)})
        assert rc == 0, output[-6000:]
        assert report["result"] == "in_sync" and report["items"] == [] and report["failures"] == [], report
        assert "admin.kubeconfig" not in json.dumps(report["runs"])
    finally:
        kubectl(lab, "delete", "namespace", "gpu-drift", "--ignore-not-found", "--wait=false")
        kubectl(lab, "delete", "clusterrole,clusterrolebinding", "gpu-drift", "--ignore-not-found")
        kubectl(lab, "-n", "monitoring", "delete", "role,rolebinding", "gpu-drift-secrets", "--ignore-not-found")


# Eleven kinds of drift, node and cluster, made by hand as people make them; each with the class it must be found as.
NODE = "gpu-h100-0"
INJECTED = {
    "quota": ("ResourceQuota/vision/team-quota", lambda lab: kubectl(
        lab, "-n", "vision", "patch", "resourcequota", "team-quota", "--type", "merge",
        "-p", '{"spec": {"hard": {"requests.nvidia.com/gpu": "20"}}}')),
    "network_policy": ("NetworkPolicy/nlp/allow-dns", lambda lab: kubectl(
        lab, "-n", "nlp", "delete", "networkpolicy", "allow-dns")),
    "tenancy_rbac": ("RoleBinding/nlp/team-viewer", lambda lab: kubectl(
        lab, "-n", "nlp", "delete", "rolebinding", "team-viewer")),
    "tenancy_namespace": ("Namespace/vision", lambda lab: kubectl(
        lab, "label", "--overwrite", "namespace", "vision", "pod-security.kubernetes.io/enforce=privileged")),
    "device_plugin": ("ConfigMap/nvidia-device-plugin/nvidia-device-plugin-configs", lambda lab: kubectl(
        lab, "-n", "nvidia-device-plugin", "patch", "configmap", "nvidia-device-plugin-configs", "--type", "merge",
        "-p", '{"data": {"default": "version: v1\\nflags: {migStrategy: single}\\n"}}')),
    "monitoring": ("DaemonSet/gpu-monitoring/dcgm-exporter", lambda lab: kubectl(
        lab, "-n", "gpu-monitoring", "delete", "daemonset", "dcgm-exporter")),
}
INJECTED_OTHER_WAYS = {
    # (class, what the item names, how): a node label, an alert rule, and four edits on a node.
    "sharing label": ("device_plugin", NODE, lambda lab: kubectl(
        lab, "label", "--overwrite", "node", NODE, "nvidia.com/device-plugin.config=time-sliced")),
    "alert rule": ("monitoring", "ConfigMap/monitoring/prometheus-rules", lambda lab: kubectl(
        lab, "-n", "monitoring", "patch", "configmap", "prometheus-rules", "--type", "merge",
        "-p", '{"data": {"gpu-alerts.yml": "groups: []\\n"}}')),
    "containerd drop-in": ("container_runtime", "/etc/containerd/conf.d/99-nvidia.toml", lambda lab: node_sh(
        NODE, "echo '# edited by hand' >> /etc/containerd/conf.d/99-nvidia.toml")),
    "driver hold": ("driver", "nvidia-smi", lambda lab: node_sh(NODE, "apt-mark unhold nvidia-smi")),
    "CUDA default": ("cuda", "", lambda lab: node_sh(NODE, "update-alternatives --set cuda /usr/local/cuda-12.6")),
    # Not a hand edit: a GPU fell off the bus (the lab's fault doubles); the quarantine it calls for is drift too.
    "GPU fault": ("gpu_health", f"Node/{NODE}", lambda lab: labctl("fault", NODE, "--xid", "3=79", timeout=120)),
}
# The lab has three GPU nodes: the quarantine's circuit breaker must allow one of them (the default 20 % allows none).
HEALTH_SHARE = {"gpu_health_max_unhealthy_percent": 100}


def user_objects(lab: Lab) -> dict:
    """What tenants and admins made themselves; drift correction must never touch it."""
    return {"configmap": kubectl(lab, "-n", "vision", "get", "configmap", "users-own", "-o", "jsonpath={.data}"),
            "pvc": kubectl(lab, "-n", "vision", "get", "pvc", "users-data", "-o", "jsonpath={.spec.resources}"),
            "deployment": kubectl(lab, "-n", "nlp", "get", "deployment", "users-app", "-o", "jsonpath={.spec.replicas}"),
            "file": node_sh(NODE, "cat /etc/containerd/conf.d/50-mine.toml")}


def test_drift_is_reported_then_repaired_by_policy_and_user_objects_survive(main_job: dict, lab: Lab,
                                                                             tmp_path: Path) -> None:
    assert main_job["site"]["rc"] == 0, "site.yml failed: no converged lab to change"
    kubectl(lab, "-n", "vision", "create", "configmap", "users-own", "--from-literal=model=resnet")
    (tmp_path / "user.yaml").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "users-data", "namespace": "vision"},
         "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "users-app", "namespace": "nlp"},
         "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "users-app"}}, "template": {
             "metadata": {"labels": {"app": "users-app"}},
             "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}}}}]}))
    kubectl(lab, "apply", "-f", str(tmp_path / "user.yaml"))
    node_sh(NODE, "printf '# mine\\n' > /etc/containerd/conf.d/50-mine.toml")
    users_before = user_objects(lab)
    for _, inject in INJECTED.values():
        inject(lab)
    for _, _, inject in INJECTED_OTHER_WAYS.values():
        inject(lab)
    limit = ["--limit", f"cluster_control,{NODE}"]
    try:
        # Default policy: every class is reported, nothing changes.
        rc, report, output = drift_run(tmp_path, *limit, policy=HEALTH_SHARE)
        assert rc == 2, output[-6000:]
        found = {(item["class"], item["resource"]) for item in report["items"]}
        for drift_class, (resource, _) in INJECTED.items():
            assert (drift_class, resource) in found, (drift_class, resource, sorted(found))
        for what, (drift_class, resource, _) in INJECTED_OTHER_WAYS.items():
            assert any(c == drift_class and resource in r for c, r in found), (what, sorted(found))
        assert {item["decision"] for item in report["items"]} == {"report"}
        # A task check mode cannot verify is listed as such (the CUDA role's ldconfig handler), never as in sync.
        assert any(u["task"] == "CUDA toolkit | ldconfig" for u in report["unverifiable"]), report["unverifiable"]
        assert {item["host"] for item in report["items"]} == {"localhost", NODE}
        assert kubectl(lab, "-n", "vision", "get", "resourcequota", "team-quota",
                       "-o", "jsonpath={.spec.hard.requests\\.nvidia\\.com/gpu}") == "20"
        quota = next(item for item in report["items"] if item["class"] == "quota")
        assert {"path": "spec.hard.requests.nvidia.com/gpu", "before": "20", "after": "14"} in quota["diff"]
        metrics = (tmp_path / "drift" / "gpu_drift.prom").read_text(encoding="utf-8")
        assert 'gpu_drift_detected{class="quota",host="localhost"} 1' in metrics
        health = next(item for item in report["items"] if item["class"] == "gpu_health")
        assert any(change["path"] == "spec.taints" for change in health["diff"]), health
        assert not kubectl(lab, "get", "node", NODE, "-o", "jsonpath={.spec.taints}")

        # Repair everything: the re-check confirms, and what users made is as it was.
        rc, report, output = drift_run(tmp_path, *limit, policy={**HEALTH_SHARE, "gpu_drift_policy": {
            name: "repair" for name in ("driver", "cuda", "container_runtime", "scheduling", "device_plugin",
                                        "monitoring", "tenancy_namespace", "tenancy_rbac", "quota", "network_policy",
                                        "gpu_health")}})
        assert rc == 3, output[-6000:]
        assert {item["result"] for item in report["items"]} == {"repaired"}, report["items"]
        assert [run["name"] for run in report["runs"]] == ["check", "repair", "recheck"]
        assert kubectl(lab, "-n", "vision", "get", "resourcequota", "team-quota",
                       "-o", "jsonpath={.spec.hard.requests\\.nvidia\\.com/gpu}") == "14"
        assert "nvidia-smi" in node_sh(NODE, "apt-mark showhold")
        assert "gpu-cluster.dev/gpu-unhealthy" in kubectl(lab, "get", "node", NODE, "-o", "jsonpath={.spec.taints}")
        assert user_objects(lab) == users_before
    finally:
        # The GPU replaced: the node released, so the tests after this one find a healthy lab.
        labctl("fault", NODE, "--clear", timeout=120)
        released = subprocess.run(["ansible-playbook", "playbooks/health.yml", "--limit", f"cluster_control,{NODE}",
                                   "-e", json.dumps(HEALTH_SHARE)], cwd=ROOT, env=playbook_env(), text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600, check=False)
        assert released.returncode == 0, released.stdout[-3000:]
        kubectl(lab, "-n", "vision", "delete", "configmap", "users-own", "pvc", "users-data", "--ignore-not-found")
        kubectl(lab, "-n", "nlp", "delete", "deployment", "users-app", "--ignore-not-found")
        node_sh(NODE, "rm -f /etc/containerd/conf.d/50-mine.toml")


def drift_apply(tmp: Path, plan: str) -> tuple[int, dict, str]:
    """`gpu_ops_drift apply PLAN`, the explicit step a person takes; (exit code, its report, output)."""
    argv = [str(ROOT / ".venv" / "bin" / "python"), "runner/gpu_ops_drift.py", "apply", plan, "-i", "inventories/lab",
            "--reports", str(tmp / "drift")]
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    done = subprocess.run(argv, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=SITE_TIMEOUT_S, check=False)
    report = json.loads((tmp / "drift" / "latest.json").read_text(encoding="utf-8"))
    import jsonschema

    jsonschema.validate(report, DRIFT_SCHEMA)
    return done.returncode, report, done.stdout


PLUGIN_CONFIGS = ("nvidia-device-plugin", "configmap", "nvidia-device-plugin-configs")


def plugin_default_config(lab: Lab) -> str:
    return kubectl(lab, "-n", PLUGIN_CONFIGS[0], "get", *PLUGIN_CONFIGS[1:], "-o", "jsonpath={.data.default}")


def edit_plugin_config(lab: Lab, strategy: str) -> None:
    kubectl(lab, "-n", PLUGIN_CONFIGS[0], "patch", *PLUGIN_CONFIGS[1:], "--type", "merge",
            "-p", json.dumps({"data": {"default": f"version: v1\nflags: {{migStrategy: {strategy}}}\n"}}))


def test_approve_writes_a_plan_that_only_the_explicit_step_applies_and_an_unreachable_node_is_reported(
        main_job: dict, lab: Lab, tmp_path: Path) -> None:
    assert main_job["site"]["rc"] == 0, "site.yml failed: no converged lab to change"
    converged = plugin_default_config(lab)
    approve = {"gpu_drift_policy": {"device_plugin": "approve"}}
    down = "gpu-a100-0"
    try:
        edit_plugin_config(lab, "single")
        podman("stop", "--time", "5", down)
        # One node cannot be reached: reported as such, the rest of the run goes on (exit 2, not 1). Another node is
        # in scope: when every host of the node play is unreachable, Ansible ends the whole run before the cluster play.
        rc, report, output = drift_run(tmp_path, "--limit", f"cluster_control,{down},gpu-h100-1", policy=approve)
        assert rc == 2, output[-6000:]
        assert [entry["host"] for entry in report["unreachable"]] == [down], report["unreachable"]
        assert report["failures"] == [] and report["result"] == "drift", report
        (item,) = [item for item in report["items"] if item["class"] == "device_plugin"]
        assert item["decision"] == "approve" and item["result"] == "awaiting approval", item
        assert 'gpu_drift_unreachable_hosts 1' in (tmp_path / "drift" / "gpu_drift.prom").read_text(encoding="utf-8")
        assert plugin_default_config(lab) != converged, "approve must change nothing before the explicit step"
        plan = report["plan"]
        assert plan and Path(plan).exists()
    finally:
        podman("start", down)
    # The drift changed after approval: the plan no longer matches and applying it changes nothing.
    edit_plugin_config(lab, "mixed")
    rc, report, output = drift_apply(tmp_path, plan)
    assert rc == 1, output[-6000:]
    assert any("were not approved" in note for note in report["notes"]), report["notes"]
    assert "mixed" in plugin_default_config(lab)
    # Approved as it is now: the explicit step repairs it, and its re-check is clean.
    rc, report, output = drift_run(tmp_path, "--limit", "cluster_control", policy=approve)
    assert rc == 2 and report["plan"], output[-6000:]
    rc, report, output = drift_apply(tmp_path, report["plan"])
    assert rc == 3, output[-6000:]
    assert [run["name"] for run in report["runs"]] == ["check", "repair", "recheck"], report["runs"]
    assert {item["result"] for item in report["items"]} == {"repaired"}, report["items"]
    assert plugin_default_config(lab) == converged


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (ansible-runner starts ansible-playbook in a session of its own)."""
    import signal

    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text(encoding="utf-8").rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, tree = [pid], []
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    for member in tree:
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_two_runs_at_once_one_waits_out_a_killed_run_leaves_the_next_one_correct_and_an_object_can_opt_out(
        main_job: dict, lab: Lab, tmp_path: Path) -> None:
    assert main_job["site"]["rc"] == 0, "site.yml failed: no converged lab to change"
    import time

    quota = ("-n", "vision", "get", "resourcequota", "team-quota", "-o", "jsonpath={.spec.hard.requests\\.nvidia\\.com/gpu}")
    converged = kubectl(lab, *quota)
    kubectl(lab, "-n", "vision", "patch", "resourcequota", "team-quota", "--type", "merge",
            "-p", '{"spec": {"hard": {"requests.nvidia.com/gpu": "21"}}}')
    repair = {"gpu_drift_policy": {"quota": "repair", "tenancy_namespace": "repair", "tenancy_rbac": "repair",
                                   "network_policy": "repair"}}
    argv = [str(ROOT / ".venv" / "bin" / "python"), "runner/gpu_ops_drift.py", "check", "-i", "inventories/lab",
            "--reports", str(tmp_path / "drift"), "--limit", "cluster_control", "--extravars", json.dumps(repair)]
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    first = subprocess.Popen(argv, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        lock = tmp_path / "drift" / "drift.lock"
        deadline = time.monotonic() + 120
        while not (lock.exists() and lock.read_text(encoding="utf-8").startswith("pid")):
            assert time.monotonic() < deadline and first.poll() is None, "the first run never took the lock"
            time.sleep(0.2)
        # Started while the first one runs: it does nothing and says who holds the lock.
        second = subprocess.run(argv, cwd=ROOT, env=env, text=True, capture_output=True, timeout=120, check=False)
        assert second.returncode == 4, second.stdout + second.stderr
        assert f"pid {first.pid}" in second.stderr and "this run did nothing" in second.stderr, second.stderr
        # Killed half way through its check, with every process under it (as systemd's timeout kills a unit).
        time.sleep(10)
        assert first.poll() is None, "the first run ended before it could be killed"
        kill_tree(first.pid)
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            kill_tree(first.pid)
    # The next run finds the lock free and the drift still there, repairs it and confirms.
    rc, report, output = drift_run(tmp_path, "--limit", "cluster_control", policy=repair)
    assert rc == 3, output[-6000:]
    assert {(item["class"], item["result"]) for item in report["items"]} == {("quota", "repaired")}, report["items"]
    assert kubectl(lab, *quota) == converged
    # An object that opts itself out (an annotation with a date) is left alone by the same repair policy.
    kubectl(lab, "-n", "vision", "annotate", "resourcequota", "team-quota", "gpu-ops.dev/drift-opt-out-until=2099-12-31",
            "gpu-ops.dev/drift-opt-out-reason=quota trial")
    kubectl(lab, "-n", "vision", "patch", "resourcequota", "team-quota", "--type", "merge",
            "-p", '{"spec": {"hard": {"requests.nvidia.com/gpu": "22"}}}')
    try:
        rc, report, output = drift_run(tmp_path, "--limit", "cluster_control", policy=repair)
        assert rc == 2, output[-6000:]
        (item,) = report["items"]
        assert item["decision"] == "opted_out" and "quota trial" in item["reason"], item
        assert kubectl(lab, *quota) == "22"
    finally:
        kubectl(lab, "-n", "vision", "annotate", "resourcequota", "team-quota", "gpu-ops.dev/drift-opt-out-until-",
                "gpu-ops.dev/drift-opt-out-reason-")
        kubectl(lab, "-n", "vision", "patch", "resourcequota", "team-quota", "--type", "merge",
                "-p", json.dumps({"spec": {"hard": {"requests.nvidia.com/gpu": converged}}}))


# --- Faults on the nodes (issue 21): another package manager holds the lock ------------------------------------------

# Another package manager on the node, as unattended-upgrades or a person's apt-get would be: a POSIX lock on dpkg's
# frontend lock, the lock apt takes before it installs anything. It prints its PID and holds the lock until killed.
LOCK_HOLDER = ("import fcntl, os, sys, time  # gpu-lab-lock-holder\n"
               "handle = open('/var/lib/dpkg/lock-frontend', 'w')\n"
               "fcntl.lockf(handle, fcntl.LOCK_EX)\n"
               "print(os.getpid(), flush=True)\n"
               "time.sleep(600)\n")


def nodes_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ansible-playbook", "playbooks/nodes.yml", *args], cwd=ROOT, env=playbook_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=SITE_TIMEOUT_S, check=False)


def test_a_held_package_lock_fails_the_role_naming_its_holder_and_a_plain_rerun_converges(main_job: dict) -> None:
    assert main_job["site"]["rc"] == 0, "site.yml failed: no converged lab to change"
    host, package = "gpu-a100-0", "nvidia-container-toolkit"
    config = "/etc/containerd/conf.d/99-nvidia.toml"
    hand_made = "/etc/apt/sources.list.d/hand-made.list"
    node_sh(host, f"echo '# a person keeps this' > {hand_made}")
    before = node_sh(host, f"sha256sum {config} 2>/dev/null || true")
    # A package the role installs is gone (removed by hand), so the role's apt task needs the lock.
    node_sh(host, f"apt-mark unhold {package} >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get remove -y -q {package} >/dev/null")
    holder = subprocess.Popen(["podman", "exec", host, "python3", "-c", LOCK_HOLDER], stdout=subprocess.PIPE, text=True)
    pid = ""
    try:
        pid = holder.stdout.readline().strip() if holder.stdout else ""
        assert pid.isdigit(), f"the lock holder did not start: {pid!r}"
        limit = ("--limit", host, "--tags", "nvidia_container_toolkit")
        failed = nodes_run(*limit, "-e", json.dumps({"nvidia_container_toolkit_apt_lock_timeout": 5}))
        output = " ".join(failed.stdout.split())  # the result's message, however the callback wraps it
        assert failed.returncode != 0, failed.stdout[-4000:]
        assert "the package manager's lock was still held after 5 s (nvidia_container_toolkit_apt_lock_timeout)" in output, output[-4000:]
        assert f"/var/lib/dpkg/lock-frontend is held by process {pid} (python3 -c import fcntl, os, sys, time # gpu-lab-lock-holder" in output, output[-4000:]
        assert "apt changed nothing" in output
        # Nothing half done: dpkg has no half-installed package, the package is still absent, the runtime config
        # and the person's apt source are as they were.
        assert node_sh(host, "dpkg --audit") == ""
        assert not node_sh(host, f"dpkg-query -W -f='${{Status}}' {package} 2>/dev/null || true").endswith(" ok installed")
        assert node_sh(host, f"sha256sum {config} 2>/dev/null || true") == before
    finally:
        if pid.isdigit():
            node_sh(host, f"kill {pid} 2>/dev/null || true")
        else:
            holder.kill()
        holder.wait(timeout=60)
    # Once the other package manager is done, a plain re-run installs and holds the package again; the person's file stays.
    again = nodes_run("--limit", host, "--tags", "nvidia_container_toolkit")
    assert again.returncode == 0, again.stdout[-4000:]
    assert node_sh(host, f"dpkg-query -W -f='${{Status}}' {package}") == "hold ok installed"
    assert node_sh(host, f"cat {hand_made}") == "# a person keeps this\n"
    node_sh(host, f"rm -f {hand_made}")



def test_a_node_stopped_mid_run_is_reported_unreachable_the_others_finish_and_it_converges_next_run(
        main_job: dict, tmp_path: Path) -> None:
    """A node container stopped while the node roles run on all three: that host is unreachable, the other two
    finish their plays, and the next run on the stopped host (started again) converges."""
    assert main_job["site"]["rc"] == 0, "site.yml failed: no converged lab to change"
    import time

    down, others = "gpu-h100-1", ("gpu-h100-0", "gpu-a100-0")
    log = tmp_path / "nodes.log"
    mid_run = "TASK [gpu_ops.cluster.nvidia_container_toolkit : Read the runtimes, the packages, the repository files, the record and the CDI state]"
    with log.open("w", encoding="utf-8") as handle:
        run = subprocess.Popen(["ansible-playbook", "playbooks/nodes.yml", "--tags", "nvidia_container_toolkit"],
                               cwd=ROOT, env=playbook_env(), stdout=handle, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 600
            while mid_run not in log.read_text(encoding="utf-8"):
                assert run.poll() is None and time.monotonic() < deadline, log.read_text(encoding="utf-8")[-4000:]
                time.sleep(0.1)
            podman("stop", "--time", "2", down)
            run.wait(timeout=SITE_TIMEOUT_S)
        finally:
            if run.poll() is None:
                run.kill()
            podman("start", down)
    output = log.read_text(encoding="utf-8")
    recap = {host: (int(unreachable), int(failed)) for host, unreachable, failed in
             re.findall(r"^(\S+)\s+: ok=\d+\s+changed=\d+\s+unreachable=(\d+)\s+failed=(\d+)", output, re.MULTILINE)}
    assert recap.get(down, (0, 0))[0] == 1, output[-4000:]
    assert all(recap.get(host) == (0, 0) for host in others), (recap, output[-4000:])
    assert f"container {down} is not running" in output, output[-4000:]
    # Started again, the stopped host converges with a plain run of the same roles; a check run then finds nothing.
    for args in ((), ("--check",)):
        again = nodes_run("--limit", down, "--tags", "nvidia_container_toolkit", *args)
        assert again.returncode == 0, again.stdout[-4000:]
    changed = re.search(rf"^{down}\s+: ok=\d+\s+changed=(\d+)", again.stdout, re.MULTILINE)
    assert changed and changed.group(1) == "0", again.stdout[-4000:]


def package_status(host: str, package: str) -> str:
    return node_sh(host, f"dpkg-query -W -f='${{Status}}' {package} 2>/dev/null || true")


def interrupt_at(task: str, args: tuple[str, ...], log: Path, delay: float = 0.0) -> int:
    """nodes.yml with args, interrupted as Ctrl-C does (SIGINT to its whole process group) once `task` has started
    (plus delay seconds); returns its exit status."""
    import signal
    import time

    with log.open("w", encoding="utf-8") as handle:
        run = subprocess.Popen(["ansible-playbook", "playbooks/nodes.yml", *args], cwd=ROOT, env=playbook_env(),
                               stdout=handle, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            while f"TASK [{task}]" not in log.read_text(encoding="utf-8"):
                assert run.poll() is None and time.monotonic() < deadline, log.read_text(encoding="utf-8")[-4000:]
                time.sleep(0.05)
            time.sleep(delay)
            os.killpg(run.pid, signal.SIGINT)
            return run.wait(timeout=300)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait(timeout=60)


def interrupted(task: str, args: tuple[str, ...], log: Path, delay: float = 0.0) -> None:
    """Interrupt nodes.yml at task and check that the interrupt reached the run. Ansible stops with "User interrupted
    execution", or, when the signal lands while it collects a result, prints the KeyboardInterrupt and goes on to the
    end (seen in CI): either way what follows must find nothing half done, so both are accepted."""
    status = interrupt_at(task, args, log, delay)
    output = log.read_text(encoding="utf-8")
    assert "User interrupted execution" in output or "KeyboardInterrupt" in output, (status, output[-4000:])
    assert status != 0 or re.search(r"^\S+\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0", output, re.MULTILINE), \
        output[-4000:]


def test_runs_interrupted_in_the_driver_install_and_the_drop_in_write_leave_nothing_half_done(
        main_job: dict, tmp_path: Path) -> None:
    """SIGINT during the driver's apt install and during the containerd drop-in write; a package dpkg left unpacked
    (what an install interrupted at the wrong moment leaves): the next plain run finishes it, nothing is half written,
    the runtime keeps its nvidia entry, and a check run after it finds nothing."""
    assert main_job["site"]["rc"] == 0, "site.yml failed: no converged lab to change"
    host, package = "gpu-h100-0", "nvidia-smi"
    drop_in = "/etc/containerd/conf.d/99-nvidia.toml"
    driver = ("--limit", host, "--tags", "nvidia_driver")
    toolkit = ("--limit", host, "--tags", "nvidia_container_toolkit")

    # 1. dpkg left a package unpacked but not configured: apt refuses to install until `dpkg --configure -a`.
    node_sh(host, f"cd /tmp && apt-get download -q {package} >/dev/null && apt-mark unhold {package} >/dev/null"
                  f" && dpkg --unpack /tmp/{package}_*.deb >/dev/null 2>&1 && rm -f /tmp/{package}_*.deb")
    assert package_status(host, package).endswith(" unpacked"), package_status(host, package)
    predicted = nodes_run(*driver, "--check")
    assert predicted.returncode == 0, predicted.stdout[-4000:]
    assert "A real run finishes what dpkg left half done first (dpkg --configure -a): nvidia-smi unpacked" in \
        " ".join(predicted.stdout.split()), predicted.stdout[-4000:]
    assert package_status(host, package).endswith(" unpacked"), "check mode changed dpkg's state"
    repaired = nodes_run(*driver)
    assert repaired.returncode == 0, repaired.stdout[-4000:]
    assert re.search(r"TASK \[gpu_ops\.cluster\._common : Finish the package changes an interrupted run left "
                     r"\(dpkg --configure -a\)\][^\n]*\nchanged: \[" + host, repaired.stdout), repaired.stdout[-4000:]
    assert node_sh(host, "dpkg --audit") == ""
    assert package_status(host, package) == "hold ok installed"

    # 2. Ctrl-C while apt installs the driver package the role has to put back.
    node_sh(host, f"apt-mark unhold {package} >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get remove -y -q {package} >/dev/null")
    interrupted("gpu_ops.cluster.nvidia_driver : Install the NVIDIA driver packages", driver, tmp_path / "driver.log",
                delay=1.0)

    # 3. Ctrl-C as the toolkit role writes the containerd drop-in it has to put back.
    node_sh(host, f"rm -f {drop_in}")
    interrupted("gpu_ops.cluster.nvidia_container_toolkit : Define the NVIDIA runtime in a containerd drop-in",
                toolkit, tmp_path / "toolkit.log")
    # The drop-in is absent or whole, never half written; no scratch file is left beside it.
    assert node_sh(host, f"ls -A {os.path.dirname(drop_in)} | grep '^[.]' || true") == "", \
        node_sh(host, f"ls -la {os.path.dirname(drop_in)}")
    text = node_sh(host, f"cat {drop_in} 2>/dev/null || true")
    assert text == "" or 'runtimes.nvidia' in text or 'runtimes."nvidia"' in text, text

    # The next plain runs converge; a check run after them changes nothing; apt and the runtime are whole.
    for args in (driver, toolkit):
        again = nodes_run(*args)
        assert again.returncode == 0, again.stdout[-4000:]
        check = nodes_run(*args, "--check")
        assert check.returncode == 0, check.stdout[-4000:]
        changed = re.search(rf"^{host}\s+: ok=\d+\s+changed=(\d+)", check.stdout, re.MULTILINE)
        assert changed and changed.group(1) == "0", check.stdout[-4000:]
    assert node_sh(host, "dpkg --audit") == ""
    assert package_status(host, package) == "hold ok installed"
    assert "nvidia" in node_sh(host, f"cat {drop_in}")
    assert "nvidia" in node_sh(host, "containerd config dump 2>/dev/null | grep -A2 'runtimes.nvidia' || true")


def test_a_mirror_that_is_down_is_named_and_the_hosts_apt_keeps_working(main_job: dict) -> None:
    """The package mirror stopped while the toolkit role has a package to install: the run fails naming the mirror's
    URL before it changes anything; the host's apt sources, keys and packages are as they were and apt still works;
    with the mirror back, a plain re-run converges."""
    assert main_job["site"]["rc"] == 0, "site.yml failed: no converged lab to change"
    host, package = "gpu-a100-0", "nvidia-container-toolkit"
    apt_files = "sha256sum /etc/apt/keyrings/* /etc/apt/sources.list.d/* 2>/dev/null | sort"
    node_sh(host, f"apt-mark unhold {package} >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get remove -y -q {package} >/dev/null")
    before = node_sh(host, apt_files)
    podman("stop", "--time", "2", nodes.MIRROR_SERVER)
    try:
        failed = nodes_run("--limit", host, "--tags", "nvidia_container_toolkit")
        output = " ".join(failed.stdout.split())
        assert failed.returncode != 0, failed.stdout[-4000:]
        assert f"Could not fetch http://{nodes.MIRROR_SERVER}:8080/" in output, output[-4000:]
        assert "nvidia_container_toolkit_mirror_key_url" in output, output[-4000:]
        assert node_sh(host, apt_files) == before
        assert node_sh(host, "dpkg --audit") == ""
        assert node_sh(host, "apt-get check -q >/dev/null && echo ok").strip() == "ok"
        assert package_status(host, "nvidia-container-toolkit-base").endswith(" ok installed")
    finally:
        podman("start", nodes.MIRROR_SERVER)
    again = nodes_run("--limit", host, "--tags", "nvidia_container_toolkit")
    assert again.returncode == 0, again.stdout[-4000:]
    assert package_status(host, package) == "hold ok installed"
