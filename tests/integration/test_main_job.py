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
from pathlib import Path
from typing import Iterator

import pytest

from conftest import ROOT, Lab

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
            "ANSIBLE_CALLBACKS_ENABLED": "gpu_ops.cluster.run_record,change_log",
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
    check = run_site(tmp, "check", "--check", record_dir=tmp) if site["rc"] == 0 else None
    yield {"up": up, "site": site, "summary": summary, "check": check}
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
