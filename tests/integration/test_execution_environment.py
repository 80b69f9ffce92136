"""The execution environment, proven against the lab: `ee/build.py` builds localhost/gpu-ops-ee (cached by content:
a second build of the same content is a retag), and runner/gpu_ops_run.py runs the collection's validate playbook
inside it through ansible-runner's container mode against the lab's real API server, as AWX or Automation Platform
would run a job template with this image. The artifacts (events, stats, rc, summary.json) land where the caller asks.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, Lab, consumer_inventory

PYTHON = str(ROOT / ".venv" / "bin" / "python")
IMAGE = "localhost/gpu-ops-ee:latest"


@pytest.fixture(scope="module")
def image() -> str:
    build = subprocess.run([PYTHON, "ee/build.py"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, check=False, timeout=1800)
    assert build.returncode == 0, build.stdout[-4000:]
    return IMAGE


def test_validate_runs_inside_the_execution_environment_against_the_lab(image: str, lab: Lab, tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yml"
    # The container's own Python runs the modules; the kubeconfig and the API server are the host's (mounted, host
    # network), as an EE job reaches a cluster through its credentials.
    inventory.write_text(yaml.safe_dump(consumer_inventory(lab, "/usr/bin/python3"), sort_keys=False),
                         encoding="utf-8")
    artifacts, reports = tmp_path / "artifacts", tmp_path / "reports"
    reports.mkdir()
    run = subprocess.run(
        [PYTHON, "runner/gpu_ops_run.py", "gpu_ops.cluster.validate", "-i", str(inventory), "--artifacts", str(artifacts),
         "--limit", "cluster_control",
         "--extravars", json.dumps({"gpu_validation_smoke_test": False, "gpu_cluster_reports_dir": str(reports)}),
         "--process-isolation-executable", "podman", "--container-image", image,
         "--container-option=--network=host",
         "--container-volume", f"{lab.kubeconfig.parent}:{lab.kubeconfig.parent}:ro",
         "--container-volume", f"{reports}:{reports}"],
        cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False, timeout=900)
    assert run.returncode == 0, run.stdout[-6000:]
    (run_dir,) = [path for path in artifacts.iterdir() if path.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    assert summary["schema"] == 1 and summary["status"] == "successful" and summary["rc"] == 0, summary
    assert summary["playbook"] == "gpu_ops.cluster.validate"
    assert summary["stats"]["localhost"]["failed"] == 0 and summary["stats"]["localhost"]["ok"] > 0, summary
    assert (run_dir / "rc").read_text(encoding="utf-8").strip() == "0"
    events = [json.loads(path.read_text(encoding="utf-8")) for path in (run_dir / "job_events").glob("*.json")]
    assert any(event.get("event") == "playbook_on_stats" for event in events)
    report = json.loads((reports / "validation.json").read_text(encoding="utf-8"))
    assert report["passed"], report["problems"]
    assert set(report["cluster"]["nodes"]) == set(lab.config.host_nodes())
    assert "Verdict: PASSED" in (reports / "validation.txt").read_text(encoding="utf-8")


def test_a_second_build_of_the_same_content_builds_nothing(image: str) -> None:
    again = subprocess.run([PYTHON, "ee/build.py"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, check=False, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:]
    assert "cached: " in again.stdout and "STEP 1" not in again.stdout, again.stdout[-3000:]
