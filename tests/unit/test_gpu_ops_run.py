"""runner/gpu_ops_run.py: its pure functions, and real ansible-runner runs of small playbooks against localhost."""

from __future__ import annotations

import io
import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict

import pytest

from conftest import REPO_ROOT, load_source

gpu_ops_run = load_source("gpu_ops_run", REPO_ROOT / "runner" / "gpu_ops_run.py")

MOMENT = datetime(2026, 12, 3, 10, 15, 30, tzinfo=timezone.utc)

PLAYBOOK = """\
- name: Smoke
  hosts: all
  gather_facts: false
  tasks:
    - name: Say hello
      ansible.builtin.debug:
        msg: "greeting={{ greeting | default('none') }} env={{ lookup('ansible.builtin.env', 'GPU_OPS_RUN_TEST') }}"
    - name: Write a file
      ansible.builtin.copy:
        content: "written\\n"
        dest: "{{ target }}"
        mode: "0644"
    - name: Tagged only
      ansible.builtin.debug:
        msg: tagged
      tags: [only]
"""

FAILING_PLAYBOOK = """\
- name: Failing
  hosts: all
  gather_facts: false
  tasks:
    - name: Tolerated failure
      ansible.builtin.command: "false"
      ignore_errors: true
      changed_when: false
    - name: Real failure
      ansible.builtin.fail:
        msg: the GPU count is wrong
    - name: Never reached
      ansible.builtin.debug:
        msg: unreachable
"""


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """A directory with the playbooks and a localhost inventory (local connection, this interpreter)."""
    (tmp_path / "smoke.yml").write_text(PLAYBOOK, encoding="utf-8")
    (tmp_path / "failing.yml").write_text(FAILING_PLAYBOOK, encoding="utf-8")
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "hosts.yml").write_text(
        "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n", encoding="utf-8")
    return tmp_path


def request(project: Path, **overrides: Any) -> Any:
    values: Dict[str, Any] = dict(playbook="smoke.yml", inventories=("inventory/hosts.yml",), artifacts="artifacts",
                                  cwd=str(project), project_dir=str(project))
    values.update(overrides)
    return gpu_ops_run.RunRequest(**values)


# --- pure functions ----------------------------------------------------------------------------------------------------

def test_ident_is_a_utc_timestamp_with_a_suffix_and_sorts_by_time() -> None:
    assert gpu_ops_run.make_ident(MOMENT, "3fa9c1") == "20261203T101530Z-3fa9c1"
    later = gpu_ops_run.make_ident(MOMENT + timedelta(seconds=1), "000000")
    assert sorted([later, gpu_ops_run.make_ident(MOMENT, "ffffff")])[1] == later
    other_zone = MOMENT.astimezone(timezone(timedelta(hours=2)))
    assert gpu_ops_run.make_ident(other_zone, "a") == "20261203T101530Z-a"
    with pytest.raises(ValueError):
        gpu_ops_run.make_ident(MOMENT, "Not/ok")
    first, second = gpu_ops_run.new_ident(MOMENT), gpu_ops_run.new_ident(MOMENT)
    assert first != second and first.startswith("20261203T101530Z-") and len(first.split("-")[1]) == 6


def test_playbook_is_a_file_or_a_collection_playbook(project: Path) -> None:
    assert gpu_ops_run.resolve_playbook("smoke.yml", project) == ("path", str(project / "smoke.yml"))
    assert gpu_ops_run.resolve_playbook(str(project / "smoke.yml"), Path("/")) == ("path", str(project / "smoke.yml"))
    assert gpu_ops_run.resolve_playbook("gpu_ops.cluster.validate", project) == ("collection", "gpu_ops.cluster.validate")
    (project / "gpu_ops.cluster.local.yml").write_text(PLAYBOOK, encoding="utf-8")
    assert gpu_ops_run.resolve_playbook("gpu_ops.cluster.local.yml", project)[0] == "path"
    for missing in ("missing.yml", "playbooks/site.yml", "validate"):
        with pytest.raises(gpu_ops_run.UsageError, match="no such file"):
            gpu_ops_run.resolve_playbook(missing, project)


def test_inventory_paths_are_absolute_and_host_lists_pass(project: Path) -> None:
    assert gpu_ops_run.resolve_inventory("inventory/hosts.yml", project) == str(project / "inventory" / "hosts.yml")
    assert gpu_ops_run.resolve_inventory("inventory", project) == str(project / "inventory")
    assert gpu_ops_run.resolve_inventory("localhost,", project) == "localhost,"
    with pytest.raises(gpu_ops_run.UsageError, match="host list needs a comma"):
        gpu_ops_run.resolve_inventory("nowhere.yml", project)


def test_extravars_are_json_or_a_json_or_yaml_file(tmp_path: Path) -> None:
    assert gpu_ops_run.parse_mapping_arg('{"a": 1, "b": [true]}', tmp_path) == {"a": 1, "b": [True]}
    (tmp_path / "vars.json").write_text('{"x": "y"}', encoding="utf-8")
    (tmp_path / "vars.yml").write_text("x: y\nn: 3\n", encoding="utf-8")
    assert gpu_ops_run.parse_mapping_arg("@vars.json", tmp_path) == {"x": "y"}
    assert gpu_ops_run.parse_mapping_arg(f"@{tmp_path / 'vars.yml'}", Path("/")) == {"x": "y", "n": 3}
    for bad, message in (("[1, 2]", "must be a mapping"), ("{not json", "not JSON"), ("@absent.yml", "no such file")):
        with pytest.raises(gpu_ops_run.UsageError, match=message):
            gpu_ops_run.parse_mapping_arg(bad, tmp_path)


def test_envvars_merge_pairs_json_and_files_in_order(tmp_path: Path) -> None:
    (tmp_path / "env.yml").write_text("B: from-file\nFLAG: true\n", encoding="utf-8")
    merged = gpu_ops_run.parse_envvars(["A=1", "B=x=y", '{"C": 3}', "@env.yml", "EMPTY="], tmp_path)
    assert merged == {"A": "1", "B": "from-file", "C": "3", "FLAG": "true", "EMPTY": ""}
    for bad in ("NOEQUALS", "1BAD=x", '{"A": {"nested": 1}}'):
        with pytest.raises(gpu_ops_run.UsageError):
            gpu_ops_run.parse_envvars([bad], tmp_path)


def test_mount_dirs_take_a_files_directory_and_drop_nested_ones(tmp_path: Path) -> None:
    (tmp_path / "inv" / "sub").mkdir(parents=True)
    (tmp_path / "inv" / "hosts.yml").write_text("all: {}\n", encoding="utf-8")
    (tmp_path / "invx").mkdir()
    dirs = gpu_ops_run.mount_dirs([str(tmp_path / "inv" / "hosts.yml"), str(tmp_path / "inv" / "sub"),
                                   str(tmp_path / "invx"), "localhost,"])
    assert dirs == [str(tmp_path / "inv"), str(tmp_path / "invx")]


def test_runner_kwargs_outside_a_container(project: Path) -> None:
    kwargs = gpu_ops_run.runner_kwargs(
        request(project, check=True, diff=True, limit="gpu_nodes", tags="only", extravars={"a": 1},
                envvars={"E": "1"}),
        "ID", "/tmp/pdd", project, ansible_bin="/opt/venv/bin")
    assert kwargs["playbook"] == str(project / "smoke.yml")
    assert kwargs["inventory"] == [str(project / "inventory" / "hosts.yml")]
    assert kwargs["artifact_dir"] == str(project / "artifacts") and kwargs["ident"] == "ID"
    assert kwargs["cmdline"] == "--check --diff"
    assert (kwargs["limit"], kwargs["tags"], kwargs["extravars"]) == ("gpu_nodes", "only", {"a": 1})
    assert kwargs["envvars"]["E"] == "1" and kwargs["envvars"]["PATH"].startswith("/opt/venv/bin:")
    assert kwargs["project_dir"] == str(project) and kwargs["quiet"] is True
    assert "process_isolation" not in kwargs and "skip_tags" not in kwargs and "timeout" not in kwargs


def test_runner_kwargs_in_a_container_mount_inventory_playbook_and_artifacts(project: Path) -> None:
    kwargs = gpu_ops_run.runner_kwargs(
        request(project, inventories=("inventory/hosts.yml", "localhost,"), process_isolation_executable="podman",
                container_image="localhost/gpu-ops-ee:latest", container_options=("--network=host",),
                container_volumes=("/srv/kube:/srv/kube:ro",), check=True),
        "ID", "/tmp/pdd", project)
    assert kwargs["process_isolation"] is True and kwargs["process_isolation_executable"] == "podman"
    assert kwargs["container_image"] == "localhost/gpu-ops-ee:latest"
    assert "inventory" not in kwargs and "project_dir" not in kwargs
    assert kwargs["cmdline"] == f"--check -i {project / 'inventory' / 'hosts.yml'} -i localhost,"
    assert kwargs["container_volume_mounts"] == [
        f"{project}:{project}:ro",  # the inventory's and the playbook's directory: one mount
        f"{project / 'artifacts'}:/runner/artifacts:Z",
        "/srv/kube:/srv/kube:ro",
    ]
    assert kwargs["container_options"] == ["--network=host"]
    assert "PATH" not in kwargs["envvars"]
    with pytest.raises(gpu_ops_run.UsageError, match="needs --container-image"):
        gpu_ops_run.runner_kwargs(request(project, process_isolation_executable="podman"), "ID", "/tmp/pdd", project)
    with pytest.raises(gpu_ops_run.UsageError, match="only podman or docker"):
        gpu_ops_run.runner_kwargs(request(project, process_isolation_executable="bwrap"), "ID", "/tmp/pdd", project)


def test_event_lines() -> None:
    line = gpu_ops_run.event_line
    assert line({"event": "playbook_on_play_start", "event_data": {"name": "Nodes", "pattern": "gpu_nodes"}}) \
        == "PLAY    Nodes [gpu_nodes]"
    assert line({"event": "playbook_on_play_start", "event_data": {"name": "all", "pattern": "all"}}) == "PLAY    all"
    assert line({"event": "playbook_on_task_start", "event_data": {"task": "Read the GPU state"}}) \
        == "TASK    Read the GPU state"
    assert line({"event": "playbook_on_handler_task_start", "event_data": {"task": "Restart"}}) == "HANDLER Restart"
    failed = {"event": "runner_on_failed", "event_data": {"host": "gpu-0", "task": "Check",
                                                          "res": {"msg": "two\n  lines"}}}
    assert line(failed) == "FAILED  gpu-0: Check: two lines"
    assert line({**failed, "event_data": {**failed["event_data"], "ignore_errors": True}}) is None
    assert line({"event": "runner_on_unreachable", "event_data": {"host": "gpu-1", "task": "Ping",
                                                                   "res": {"msg": "ssh: timeout"}}}) \
        == "UNREACHABLE gpu-1: Ping: ssh: timeout"
    assert line({"event": "runner_on_failed", "event_data": {"host": "h", "task": "t", "res": {"stderr": "x" * 999}}}) \
        .endswith("...")
    for quiet in ("runner_on_ok", "playbook_on_stats", "verbose", None):
        assert line({"event": quiet, "event_data": {}}) is None


def test_host_stats_rename_and_fill_every_counter() -> None:
    stats = {"ok": {"a": 3, "b": 1}, "changed": {"a": 1}, "failures": {"b": 1}, "dark": {"c": 1},
             "skipped": {}, "rescued": {}, "ignored": {"a": 2}, "processed": {"a": 1, "b": 1, "c": 1, "d": 1}}
    assert gpu_ops_run.host_stats(stats) == {
        "a": {"ok": 3, "changed": 1, "failed": 0, "unreachable": 0, "skipped": 0, "rescued": 0, "ignored": 2},
        "b": {"ok": 1, "changed": 0, "failed": 1, "unreachable": 0, "skipped": 0, "rescued": 0, "ignored": 0},
        "c": {"ok": 0, "changed": 0, "failed": 0, "unreachable": 1, "skipped": 0, "rescued": 0, "ignored": 0},
        "d": {"ok": 0, "changed": 0, "failed": 0, "unreachable": 0, "skipped": 0, "rescued": 0, "ignored": 0},
    }
    assert gpu_ops_run.host_stats(None) == {} and gpu_ops_run.host_stats({}) == {}


def test_summary_document_and_its_text(project: Path) -> None:
    stats = {"localhost": {"ok": 2, "changed": 1, "failed": 0, "unreachable": 0, "skipped": 0, "rescued": 0,
                           "ignored": 0}}
    summary = gpu_ops_run.summary_document(
        ident="ID", playbook="gpu_ops.cluster.validate", inventories=["/inv"], status="successful", rc=0,
        started=MOMENT, finished=MOMENT + timedelta(seconds=12.5), stats=stats, request=request(project, check=True),
        artifact_dir="/art/ID")
    assert summary["schema"] == 1
    assert {k: summary[k] for k in ("ident", "playbook", "inventory", "status", "rc", "started", "finished")} == {
        "ident": "ID", "playbook": "gpu_ops.cluster.validate", "inventory": ["/inv"], "status": "successful",
        "rc": 0, "started": "2026-12-03T10:15:30Z", "finished": "2026-12-03T10:15:42Z"}
    assert summary["duration_s"] == 12.5 and summary["check"] is True and summary["container_image"] is None
    assert json.loads(json.dumps(summary)) == summary
    text = gpu_ops_run.format_summary(summary)
    assert text.splitlines()[0].startswith("successful rc=0 in 12.5s")
    assert any(row.split() == ["localhost", "2", "1", "0", "0", "0"] for row in text.splitlines())
    assert "no stats" in gpu_ops_run.format_summary({**summary, "stats": {}, "rc": 4})
    assert "no host matched" in gpu_ops_run.format_summary({**summary, "stats": {}})


def test_stdout_tail_drops_colours_and_blank_lines() -> None:
    text = "noise\n\x1b[0;31m[ERROR]: YAML parsing failed\x1b[0m\n\n  \nline 2\n" + "".join(f"x{i}\n" for i in range(9))
    assert gpu_ops_run.stdout_tail(text, 3) == ["[ERROR]: YAML parsing failed", "line 2", "x0"]
    assert gpu_ops_run.stdout_tail("a\n\x1b[0mb\nc\n", 2) == ["b", "c"]
    assert gpu_ops_run.stdout_tail("") == []


def test_cli_refuses_bad_arguments_before_running(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(project)
    for argv in (["missing.yml", "-i", "inventory/hosts.yml", "--artifacts", "a"],
                 ["smoke.yml", "-i", "inventory/hosts.yml", "--artifacts", "a", "--extravars", "[1]"],
                 ["smoke.yml", "-i", "inventory/hosts.yml", "--artifacts", "a", "--process-isolation-executable",
                  "podman"]):
        with pytest.raises(SystemExit) as exit_info:
            gpu_ops_run.main(argv)
        assert exit_info.value.code == 2
    assert not (project / "a").exists()
    assert "needs --container-image" in capsys.readouterr().err


# --- real runs ---------------------------------------------------------------------------------------------------------

def events(artifact_dir: Path) -> list:
    loaded = [json.loads(p.read_text(encoding="utf-8")) for p in (artifact_dir / "job_events").glob("*.json")]
    return sorted(loaded, key=lambda event: event["counter"])


def test_real_run_writes_artifacts_and_summary(project: Path) -> None:
    target = project / "written.txt"
    out = io.StringIO()
    outcome = gpu_ops_run.run_playbook(
        request(project, extravars={"greeting": "hello", "target": str(target)},
                envvars={"GPU_OPS_RUN_TEST": "from-env"}), out=out)
    assert (outcome.rc, outcome.status) == (0, "successful")
    assert target.read_text(encoding="utf-8") == "written\n"
    artifact_dir = project / "artifacts" / outcome.ident
    assert outcome.artifact_dir == artifact_dir
    assert (artifact_dir / "rc").read_text() == "0" and (artifact_dir / "status").read_text() == "successful"
    assert "greeting=hello env=from-env" in (artifact_dir / "stdout").read_text(encoding="utf-8")
    kinds = [e["event"] for e in events(artifact_dir)]
    assert kinds[0] == "playbook_on_start" and kinds[-1] == "playbook_on_stats"
    assert kinds.count("playbook_on_task_start") == 3
    summary = json.loads((artifact_dir / "summary.json").read_text(encoding="utf-8"))
    assert summary == outcome.summary
    assert (summary["schema"], summary["ident"], summary["status"], summary["rc"]) == (1, outcome.ident,
                                                                                       "successful", 0)
    assert summary["playbook"] == str(project / "smoke.yml")
    assert summary["inventory"] == [str(project / "inventory" / "hosts.yml")]
    assert summary["stats"] == {"localhost": {"ok": 3, "changed": 1, "failed": 0, "unreachable": 0, "skipped": 0,
                                              "rescued": 0, "ignored": 0}}
    assert summary["started"] <= summary["finished"]
    printed = out.getvalue().splitlines()
    assert printed[0] == f"run {outcome.ident}: {project / 'smoke.yml'}"
    assert "PLAY    Smoke [all]" in printed and "TASK    Write a file" in printed
    assert printed[-1] == f"artifacts: {artifact_dir}"

    # Check mode with diff and a tag: nothing written, the tagged task only.
    target.unlink()
    again = gpu_ops_run.run_playbook(request(project, check=True, diff=True, tags="only",
                                             extravars={"target": str(target)}), out=io.StringIO())
    assert again.rc == 0 and again.ident != outcome.ident and not target.exists()
    assert again.summary["check"] is True and again.summary["stats"]["localhost"]["ok"] == 1
    command = json.loads((project / "artifacts" / again.ident / "command").read_text(encoding="utf-8"))["command"]
    assert command[1:3] == ["--check", "--diff"] and command[command.index("--tags") + 1] == "only"


def test_real_failing_run_through_the_cli_exits_with_the_playbooks_rc(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    out = io.StringIO()
    rc = gpu_ops_run.main(["failing.yml", "-i", "inventory", "--artifacts", str(project / "runs")], out=out)
    assert rc == 2
    (artifact_dir,) = (project / "runs").iterdir()
    summary = json.loads((artifact_dir / "summary.json").read_text(encoding="utf-8"))
    assert (summary["status"], summary["rc"]) == ("failed", 2)
    assert summary["inventory"] == [str(project / "inventory")]
    assert summary["stats"]["localhost"] == {"ok": 1, "changed": 0, "failed": 1, "unreachable": 0, "skipped": 0,
                                             "rescued": 0, "ignored": 1}
    assert (artifact_dir / "rc").read_text() == "2"
    lines = out.getvalue().splitlines()
    assert "FAILED  localhost: Real failure: the GPU count is wrong" in lines
    assert not any("Tolerated failure:" in line for line in lines if line.startswith("FAILED"))
    assert "TASK    Never reached" not in lines
    assert lines[-4].startswith("failed rc=2 in ")


def test_real_run_that_stops_before_its_stats_says_why(project: Path) -> None:
    (project / "broken.yml").write_text("- name: Broken\n  hosts: all\n  tasks:\n    - ansible.builtin.debug: msg: x\n",
                                        encoding="utf-8")
    out = io.StringIO()
    outcome = gpu_ops_run.run_playbook(request(project, playbook="broken.yml"), out=out)
    assert outcome.rc == 4 and outcome.status == "failed" and outcome.summary["stats"] == {}
    summary = json.loads((outcome.artifact_dir / "summary.json").read_text(encoding="utf-8"))
    assert (summary["rc"], summary["stats"]) == (4, {})
    printed = out.getvalue()
    assert "  | [ERROR]: YAML parsing failed" in printed and "no stats" in printed
