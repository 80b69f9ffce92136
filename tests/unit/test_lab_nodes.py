"""The lab's node container helpers: inventory parsing and the main job's summary table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))

import nodes  # noqa: E402


def test_node_names_come_from_the_gpu_nodes_group():
    inventory = {"gpu_nodes": {"hosts": ["gpu-h100-0", "gpu-a100-0"]}, "all": {"children": ["gpu_nodes", "ungrouped"]}}
    assert nodes.node_names(inventory) == ["gpu-h100-0", "gpu-a100-0"]
    assert nodes.node_names({"all": {}}) == []


def test_lab_inventory_lists_the_node_containers():
    text = nodes.INVENTORY.read_text(encoding="utf-8")
    for name in ("gpu-h100-0", "gpu-h100-1", "gpu-a100-0"):
        assert f"{name}:" in text
    assert "ansible_connection: gpu_lab_podman" in text


def test_summary_table_rows():
    report = {
        "gpu-h100-0": {
            "nvidia_driver": {"managed": {"source": "distribution", "branch": "535", "kernel_modules": "open",
                                          "packages": ["a", "b", "c"], "held": True},
                              "in_container": True, "loaded_version": None, "action": "none"},
            "nvidia_gpu": {"error_kind": "driver_not_loaded", "error": "NVIDIA-SMI has failed", "healthy": False},
        },
        "gpu-a100-0": {
            "nvidia_driver": {"managed": {"source": "cuda_repo", "branch": "580", "kernel_modules": "open",
                                          "packages": ["a"], "held": False},
                              "in_container": False, "loaded_version": "570.1", "action": "reboot",
                              "action_reason": "loaded 570.1, installed 580.2"},
            "nvidia_gpu": {"error_kind": None, "healthy": True, "gpu_count": 4},
            "cuda_toolkit": {"versions": ["12.6", "12.8"], "default_version": "12.8"},
            "nvidia_container_toolkit": {"version": "1.20.2", "runtimes": ["containerd", "docker"],
                                         "default_for": ["docker"]},
        },
    }
    lines = nodes.summary_table(report).splitlines()
    assert lines[0].split()[0] == "node" and lines[0].rstrip().endswith("GPU check")
    assert lines[2].startswith("gpu-a100-0") and "cuda_repo/580 (open)" in lines[2] and " no " in lines[2]
    assert "reboot: loaded 570.1, installed 580.2" in lines[2] and lines[2].endswith("healthy, 4 GPUs")
    assert "12.6, 12.8*" in lines[2] and "1.20.2: containerd, docker (default)" in lines[2]
    assert lines[3].startswith("gpu-h100-0") and "distribution/535 (open)" in lines[3]
    assert "not loaded (container)" in lines[3]
    assert lines[3].endswith("driver_not_loaded: NVIDIA-SMI has failed")


def test_gpu_check_column():
    assert nodes.gpu_check({}) == "not run"
    assert nodes.gpu_check({"healthy": False, "error_kind": None, "problems": ["expected 8 GPUs, found 7"]}) == (
        "expected 8 GPUs, found 7")


def test_share_debs_links_every_package_into_every_directory(tmp_path):
    first, second, third = (tmp_path / name for name in ("shared", "node-a", "node-b"))
    for directory in (first, second, third):
        directory.mkdir()
    (first / "a.deb").write_bytes(b"a")
    (second / "b.deb").write_bytes(b"b")
    (second / "lock").write_bytes(b"")
    assert nodes.share_debs([first, second, third]) == 4
    for directory in (first, second, third):
        assert sorted(p.name for p in directory.glob("*.deb")) == ["a.deb", "b.deb"]
    assert (third / "a.deb").stat().st_ino == (first / "a.deb").stat().st_ino
    assert not (first / "lock").exists()
    assert nodes.share_debs([first, second, third]) == 0


def test_summary_merges_the_cluster_view_and_the_validation_verdict():
    report = nodes.merge_reports({"gpu-a100-0": {"nvidia_driver": {}}},
                                 {"hosts": {"gpu-a100-0": {"healthy": True, "gpu_count": 4, "error_kind": None}}})
    rows = [{"name": "gpu-a100-0", "ready": "Ready", "gpus": "nvidia.com/gpu=4"},
            {"name": "cpu-0", "ready": "Ready", "gpus": "-"}]
    lines = nodes.summary_table(report, rows).splitlines()
    assert lines[2].startswith("cpu-0") and lines[2].endswith("no host (simulated only)")
    assert "nvidia.com/gpu=4" in lines[3] and lines[3].endswith("healthy, 4 GPUs")
    assert nodes.verdict_lines({"passed": True, "smoke": {"ran": True, "succeeded": True, "node": "gpu-h100-0"}}) == [
        "validation: PASSED (hosts, cluster, CUDA smoke Job succeeded on gpu-h100-0; details in "
        "reports/validation.txt)"]
    failed = nodes.verdict_lines({"passed": False, "problems": ["gpu-a100-0: node is not Ready"], "smoke": {}})
    assert failed == ["validation: FAILED, 1 problem(s) (reports/validation.txt):", "  - gpu-a100-0: node is not Ready"]
    assert nodes.verdict_lines({}) == ["validation: not run (reports/validation.json is missing)"]


# The run record as plugins/callback/run_record.py writes it (tests/unit/test_run_record.py checks that side).
STARTED = "2026-05-09T07:00:00Z"
STARTED_TS = nodes.iso_timestamp(STARTED)
FAILED_RUN = {
    "schema": 1, "playbook": "playbooks/site.yml", "check_mode": False, "started": STARTED,
    "ended": "2026-05-09T07:04:10Z", "status": "failed", "log": "reports/site.log",
    "hosts": {
        "gpu-h100-0": {"state": "failed", "last_play": "Provision GPU nodes",
                       "last_task": "cuda_toolkit : Fetch the repository signing key",
                       "failure": {"play": "Provision GPU nodes",
                                   "task": "cuda_toolkit : Fetch the repository signing key",
                                   "message": "Request failed: <urlopen error [Errno -2] Name or service not known>\n"
                                              + "x" * 300},
                       "recap": {"ok": 21, "changed": 4, "failed": 1, "unreachable": 0, "skipped": 3, "rescued": 0,
                                 "ignored": 0}},
        "gpu-a100-0": {"state": "unreachable", "last_play": "Provision GPU nodes", "last_task": "Gathering Facts",
                       "failure": {"play": "Provision GPU nodes", "task": "Gathering Facts",
                                   "message": "no such container"},
                       "recap": {"ok": 0, "changed": 0, "failed": 0, "unreachable": 1, "skipped": 0, "rescued": 0,
                                 "ignored": 0}},
        "gpu-h100-1": {"state": "ok", "last_play": "Provision GPU nodes",
                       "last_task": "nvidia_container_toolkit : Wire the nvidia runtime into containerd",
                       "recap": {"ok": 40, "changed": 9, "failed": 0, "unreachable": 0, "skipped": 5, "rescued": 0,
                                 "ignored": 0}},
    },
}
OLD_NODES = {"gpu-h100-0": {"nvidia_driver": {"managed": {"source": "earlier-run-source", "branch": "470"}}}}
CLUSTER = [{"name": "gpu-h100-0", "ready": "Ready", "gpus": "nvidia.com/gpu=8"}]


def passed_run() -> dict:
    hosts = {name: {"state": "ok", "last_play": "Validation verdict", "last_task": "gpu_validation : Verdict",
                    "recap": {"ok": 30, "changed": 0, "failed": 0, "unreachable": 0, "skipped": 2, "rescued": 0,
                              "ignored": 0}} for name in ("gpu-h100-0", "localhost")}
    return {**FAILED_RUN, "status": "ok", "hosts": hosts}


def test_failed_run_without_nodes_report_shows_what_each_host_reached():
    text = nodes.summary_text(nodes.Reports(record=FAILED_RUN, record_written=STARTED_TS + 250), CLUSTER)
    lines = text.splitlines()
    assert "site.yml FAILED: 1 failed (gpu-h100-0), 1 unreachable (gpu-a100-0), 1 ok" in lines
    assert "log: reports/site.log" in lines and "record: reports/site-run.json" in lines
    assert "reports/nodes.json: not written by this run (site.yml did not reach playbooks/report.yml)" in lines
    header = next(line for line in lines if line.startswith("host "))
    assert header.split() == ["host", "state", "last", "play", "last", "task", "recap", "failure"]
    row = next(line for line in lines if line.startswith("gpu-h100-0 ") and "failed" in line)
    assert "cuda_toolkit : Fetch the repository signing key" in row and "ok=21 changed=4 failed=1 skipped=3" in row
    assert "Name or service not known" in row and row.endswith("...") and len(row) < 300
    assert next(line for line in lines if line.startswith("gpu-a100-0 ")).split()[1] == "unreachable"
    # The simulated cluster's nodes still show, without a host view.
    assert lines[0].split() == ["node", "cluster", "GPUs", "advertised"] and "nvidia.com/gpu=8" in lines[2]
    assert "GPU check" not in text and "validation:" not in text


def test_stale_nodes_report_is_not_shown_as_this_runs():
    reports = nodes.Reports(nodes=OLD_NODES, nodes_written=STARTED_TS - 3600,
                            validation={"passed": True, "smoke": {}}, validation_written=STARTED_TS - 3500,
                            record=FAILED_RUN, record_written=STARTED_TS + 250)
    text = nodes.summary_text(reports, CLUSTER)
    assert "earlier-run-source" not in text and "validation: PASSED" not in text
    assert ("reports/nodes.json: from an earlier run (written 2026-05-09 06:00:00 UTC, before this run started at "
            "2026-05-09 07:00:00 UTC): not shown") in text
    assert "site.yml FAILED: " in text


def test_interrupted_run_is_a_failure():
    running = {**FAILED_RUN, "status": "running", "ended": None}
    text = nodes.summary_text(nodes.Reports(record=running, record_written=STARTED_TS + 100))
    assert "site.yml FAILED: it stopped part way, without a recap" in text
    assert "reports/nodes.json: not written by this run" in text and "record: reports/site-run.json" in text


def test_failure_after_the_report_shows_this_runs_table_and_the_failure():
    reports = nodes.Reports(nodes=OLD_NODES, nodes_written=STARTED_TS + 200,
                            validation={"passed": False, "problems": ["gpu-h100-0: node is not Ready"], "smoke": {}},
                            validation_written=STARTED_TS + 240, record=FAILED_RUN, record_written=STARTED_TS + 250)
    text = nodes.summary_text(reports, CLUSTER)
    assert "earlier-run-source/470" in text and "validation: FAILED, 1 problem(s)" in text
    assert "site.yml FAILED: " in text and "from an earlier run" not in text


def test_passed_run_shows_the_table_and_names_the_log():
    validation = {"passed": True, "smoke": {"ran": True, "succeeded": True, "node": "gpu-h100-0"}}
    reports = nodes.Reports(nodes=OLD_NODES, nodes_written=STARTED_TS + 200, validation=validation,
                            validation_written=STARTED_TS + 240, record=passed_run(), record_written=STARTED_TS + 250)
    text = nodes.summary_text(reports, CLUSTER)
    expected = nodes.nodes_summary(OLD_NODES, reports.validation, CLUSTER)
    assert text == expected + "\nlog: reports/site.log"
    assert expected.splitlines()[-1].startswith("validation: PASSED")
    assert "FAILED" not in text and "record:" not in text


def test_no_report_and_no_record_says_site_has_not_run():
    text = nodes.summary_text(nodes.Reports(), CLUSTER)
    assert text.startswith("site.yml has not run, or stopped before its first play")
    assert "gpu-h100-0  Ready" in text


def test_record_older_than_the_nodes_report_is_ignored():
    reports = nodes.Reports(nodes=OLD_NODES, nodes_written=STARTED_TS + 9000, record=FAILED_RUN,
                            record_written=STARTED_TS + 250)
    text = nodes.summary_text(reports, CLUSTER)
    assert "earlier-run-source/470" in text and "FAILED" not in text
    assert text.splitlines()[-1].startswith("(reports/site-run.json is older than reports/nodes.json")


def test_summary_reads_the_reports(tmp_path, monkeypatch):
    for name in ("REPORT", "VALIDATION", "RUN_RECORD"):
        monkeypatch.setattr(nodes, name, tmp_path / f"{name}.json")
    assert nodes.summary().startswith("site.yml has not run")
    nodes.RUN_RECORD.write_text(json.dumps(FAILED_RUN), encoding="utf-8")
    assert "site.yml FAILED: 1 failed (gpu-h100-0)" in nodes.summary()


def test_mig_faults_are_added_to_the_description_and_the_double_accepts_them(tmp_path: Path) -> None:
    import os
    import subprocess

    faults = nodes.merged_faults({"missing_gpus": [3]}, mig_reset_required=True, gpu_processes=[(0, 4242)])
    assert faults == {"missing_gpus": [3], "mig_reset_required": True,
                      "processes": [{"index": 0, "pid": 4242, "name": "python3", "used_memory_mib": 1000}]}
    assert nodes.merged_faults(faults, gpu_processes=[(1, 7)])["processes"][1]["pid"] == 7
    assert nodes.merged_faults(faults, clear=True) == {}
    description = tmp_path / "gpus.json"
    description.write_text(json.dumps({"product": "NVIDIA H100 80GB HBM3", "count": 8, "faults": faults}))
    env = dict(os.environ, GPU_LAB_GPUS=str(description), GPU_LAB_STATE_ROOT=str(tmp_path / "state"),
               GPU_LAB_NVML_LIBDIR=str(tmp_path))
    apps = subprocess.run([str(nodes.NVIDIA_SMI_DOUBLE), "--query-compute-apps=pid,process_name",
                           "--format=csv,noheader"], env=env, capture_output=True, text=True, check=False)
    assert (apps.returncode, apps.stdout) == (0, "4242, python3\n"), apps.stderr
    enable = subprocess.run([str(nodes.NVIDIA_SMI_DOUBLE), "-i", "1", "-mig", "1"], env=env, capture_output=True,
                            text=True, check=False)
    assert enable.returncode == 0 and "pending enable state" in enable.stdout


def test_a_container_listed_as_running_whose_processes_are_gone_is_made_again(tmp_path: Path, monkeypatch) -> None:
    """podman keeps listing a container as running after its processes were killed with the session that started
    it; `podman exec` then fails ("cannot exec in a stopped container") and so would every test on it."""
    import subprocess

    commands: list[list[str]] = []

    listed = {nodes.LABEL: {"gpu-h100-0": "running", "gpu-h100-1": "running"}, nodes.MIRROR_LABEL: {}}

    def container_states(label: str = nodes.LABEL) -> dict[str, str]:
        return dict(listed[label])

    def fake_run(argv, check=True, **_):
        commands.append(list(argv))
        if argv[:2] == ["podman", "rm"]:
            for name in argv[2:]:
                listed[nodes.LABEL].pop(name, None)
        stale = argv[:2] == ["podman", "exec"] and argv[2] == "gpu-h100-0"
        return subprocess.CompletedProcess(argv, 255 if stale else 0, stdout="", stderr="")

    monkeypatch.setattr(nodes, "run", fake_run)
    monkeypatch.setattr(nodes, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(nodes, "container_states", container_states)
    for name in ("ensure_network", "wait_for_systemd", "install_node_runtime", "install_nvidia_smi_double"):
        monkeypatch.setattr(nodes, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(nodes, "ensure_mirror_server", lambda: False)
    nodes.up(["gpu-h100-0", "gpu-h100-1"], {})
    assert [argv[-1] for argv in commands if argv[:2] == ["podman", "rm"]] == ["gpu-h100-0"]
    created = [argv for argv in commands if argv[:2] == ["podman", "run"]]
    assert [argv[argv.index("--name") + 1] for argv in created] == ["gpu-h100-0"]
    assert not any(argv[:2] == ["podman", "rm"] and "gpu-h100-1" in argv for argv in commands)


def test_dead_node_and_mirror_containers_are_removed_and_live_ones_kept(monkeypatch) -> None:
    """The mirror dies with the node containers (one session started them all); a live one is never touched."""
    import subprocess

    listed = {nodes.LABEL: {"gpu-h100-0": "running", "gpu-a100-0": "running", "gpu-h100-1": "exited"},
              nodes.MIRROR_LABEL: {nodes.MIRROR_SERVER: "running"}}
    dead = {"gpu-a100-0", nodes.MIRROR_SERVER}
    commands: list[list[str]] = []

    def fake_run(argv, check=True, **_):
        commands.append(list(argv))
        stale = argv[:2] == ["podman", "exec"] and argv[2] in dead
        return subprocess.CompletedProcess(argv, 255 if stale else 0, stdout="", stderr="")

    monkeypatch.setattr(nodes, "run", fake_run)
    monkeypatch.setattr(nodes, "container_states", lambda label=nodes.LABEL: listed[label])
    assert nodes.remove_dead_containers() == ["gpu-a100-0", nodes.MIRROR_SERVER]
    assert [argv[-2:] for argv in commands if argv[:2] == ["podman", "rm"]] == [["gpu-a100-0", nodes.MIRROR_SERVER]]
    # an exited container is not probed: `podman start` brings it back
    assert not any(argv[:2] == ["podman", "exec"] and argv[2] == "gpu-h100-1" for argv in commands)


def test_a_removal_that_fails_on_a_killed_container_is_tried_once_more(monkeypatch) -> None:
    """podman's first `rm --force` of a container killed behind its back fails ("container state improper: stopped")
    and marks it exited; the second removes it (seen on this machine's podman, tests/integration/test_lab_nodes.py)."""
    import subprocess

    answers = iter([2, 0])
    commands: list[list[str]] = []

    def fake_run(argv, check=True, **_):
        commands.append(list(argv))
        code = next(answers)
        if check and code:
            raise AssertionError("the second removal must succeed")
        return subprocess.CompletedProcess(argv, code, stdout="", stderr="")

    monkeypatch.setattr(nodes, "run", fake_run)
    nodes.remove_containers(["gpu-h100-0"])
    assert commands == [["podman", "rm", "--force", "--time", "0", "--ignore", "gpu-h100-0"]] * 2
