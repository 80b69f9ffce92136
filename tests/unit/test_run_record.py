"""plugins/callback/run_record.py: the run record `make lab` keeps of site.yml, through a real ansible-playbook run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path
from typing import Any, Dict

import pytest

from conftest import REPO_ROOT, load_source

run_record = load_source("callback_run_record", REPO_ROOT / "plugins" / "callback" / "run_record.py")

SECRET = "supersecret-token-4711"

PLAYBOOK = """\
- name: Tolerated failures
  hosts: all
  gather_facts: false
  tasks:
    - name: Works
      ansible.builtin.command: "true"
      changed_when: false
    - name: Ignored failure
      ansible.builtin.fail:
        msg: ignored on purpose
      ignore_errors: true
    - name: Rescued block
      block:
        - name: Fails inside the block
          ansible.builtin.fail:
            msg: rescued on purpose
      rescue:
        - name: Rescue it
          ansible.builtin.debug:
            msg: rescued
    - name: Read the record as it stands
      ansible.builtin.set_fact:
        live_record: "{{ lookup('ansible.builtin.file', lookup('ansible.builtin.env', 'GPU_RUN_RECORD')) | from_json }}"
    - name: Check that the record is current and the tolerated failures failed nothing
      ansible.builtin.assert:
        that:
          - live_record.status == 'running'
          - live_record.current_play == 'Tolerated failures'
          - live_record.hosts[inventory_hostname].state == 'ok'
          - live_record.hosts[inventory_hostname].last_task == 'Read the record as it stands'
          - "'failure' not in live_record.hosts[inventory_hostname]"

- name: Real failures
  hosts: all
  gather_facts: false
  roles:
    - demo
  tasks:
    - name: Secret failure
      ansible.builtin.shell: echo SECRET >&2; exit 1
      changed_when: false
      no_log: true
      when: inventory_hostname == 'h2'
    - name: Last task
      ansible.builtin.debug:
        msg: reached
"""

ROLE_TASKS = """\
- name: Loud failure
  ansible.builtin.shell: "echo some output; echo 'E: apt says no' >&2; exit 3"
  changed_when: false
  when: inventory_hostname == 'h1'
"""


@pytest.fixture(scope="module")
def record_run(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """One ansible-playbook run (the repository's ansible.cfg, so its callback wiring) over three local hosts and
    one that cannot be reached; returns the record, its raw text, the run's output and exit code."""
    work = tmp_path_factory.mktemp("run_record")
    (work / "site.yml").write_text(PLAYBOOK.replace("SECRET", SECRET), encoding="utf-8")
    (work / "roles" / "demo" / "tasks").mkdir(parents=True)
    (work / "roles" / "demo" / "tasks" / "main.yml").write_text(ROLE_TASKS, encoding="utf-8")
    local = f"ansible_connection=local ansible_python_interpreter={sys.executable}"
    (work / "hosts").write_text(textwrap.dedent(f"""\
        h1 {local}
        h2 {local}
        h3 {local}
        h4 ansible_connection=ssh ansible_host=127.0.0.1 ansible_port=1 ansible_ssh_common_args='-o ConnectTimeout=5'
        """), encoding="utf-8")
    record_path = work / "reports" / "site-run.json"
    record_path.parent.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANSIBLE_", "GPU_RUN_"))}
    env.update(ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"), ANSIBLE_FORKS="4", GPU_RUN_RECORD="reports/site-run.json",
               GPU_RUN_LOG="reports/site.log", ANSIBLE_LOCAL_TEMP=str(work / "tmp"))
    result = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "hosts", "site.yml"],
                            cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = result.stdout + result.stderr
    assert record_path.is_file(), output
    text = record_path.read_text(encoding="utf-8")
    return {"record": json.loads(text), "text": text, "output": output, "rc": result.returncode,
            "leftovers": sorted(p.name for p in record_path.parent.iterdir())}


def test_record_describes_the_run(record_run: Dict[str, Any]) -> None:
    record = record_run["record"]
    assert record_run["rc"] != 0
    assert record["schema"] == 1
    assert record["playbook"] == "site.yml" and record["check_mode"] is False
    assert record["log"] == "reports/site.log"
    assert record["status"] == "failed"
    started, ended = (datetime.fromisoformat(record[key]) for key in ("started", "ended"))
    assert started.utcoffset() is not None and started.utcoffset().total_seconds() == 0
    assert started <= ended
    assert sorted(record["hosts"]) == ["h1", "h2", "h3", "h4"]
    assert record_run["leftovers"] == ["site-run.json"], "temporary files left next to the record"


def test_failed_host_names_the_role_task_and_its_error(record_run: Dict[str, Any]) -> None:
    host = record_run["record"]["hosts"]["h1"]
    assert host["state"] == "failed"
    assert host["last_play"] == "Real failures" and host["last_task"] == "demo : Loud failure"
    assert host["failure"]["play"] == "Real failures" and host["failure"]["task"] == "demo : Loud failure"
    assert host["failure"]["message"].startswith("non-zero return code")
    assert "E: apt says no" in host["failure"]["message"]
    assert host["recap"] == {"ok": 5, "changed": 0, "failed": 1, "unreachable": 0, "skipped": 0, "rescued": 1,
                             "ignored": 1}


def test_ignored_and_rescued_failures_leave_a_host_ok(record_run: Dict[str, Any]) -> None:
    host = record_run["record"]["hosts"]["h3"]
    # The in-play assert read the record after the rescue: had it marked h3 failed, h3 would have failed there.
    assert host["state"] == "ok" and "failure" not in host, record_run["output"]
    assert host["last_play"] == "Real failures" and host["last_task"] == "Last task"
    assert host["recap"]["failed"] == 0 and host["recap"]["rescued"] == 1 and host["recap"]["ignored"] == 1


def test_no_log_failure_keeps_only_the_censored_text(record_run: Dict[str, Any]) -> None:
    host = record_run["record"]["hosts"]["h2"]
    assert host["state"] == "failed" and host["failure"]["task"] == "Secret failure"
    assert "no_log" in host["failure"]["message"]
    assert SECRET not in record_run["text"]


def test_unreachable_host(record_run: Dict[str, Any]) -> None:
    host = record_run["record"]["hosts"]["h4"]
    assert host["state"] == "unreachable" and host["failure"]["task"] == "Works"
    assert host["failure"]["message"]
    assert host["recap"]["unreachable"] == 1


def test_failure_message_prefers_msg_then_output_tail() -> None:
    assert run_record.failure_message({"msg": "No package matching 'cuda-12-9'"}) == "No package matching 'cuda-12-9'"
    assert run_record.failure_message({"stdout": "a\n" * 400 + "the end"}).endswith("the end")
    long = run_record.failure_message({"msg": "non-zero return code", "stderr": "x" * 2000 + "E: the reason"})
    assert long.startswith("non-zero return code: ...") and long.endswith("E: the reason") and len(long) <= 500
    assert run_record.failure_message({"msg": {"reason": "a dict"}}) == '{"reason": "a dict"}'
    assert run_record.failure_message({}) == ""


def test_failure_message_of_a_loop_names_the_failed_item() -> None:
    result = {"msg": "One or more items failed", "results": [{"failed": False, "msg": "fine"},
                                                            {"failed": True, "msg": "item 2 broke"}]}
    assert run_record.failure_message(result) == "item 2 broke"
    censored = {"msg": "One or more items failed", "results": [{"failed": True, "censored": "hidden (no_log)"}]}
    assert run_record.failure_message(censored) == "hidden (no_log)"


def test_final_state_and_status_come_from_the_recap() -> None:
    assert run_record.final_state({"failed": 0, "unreachable": 0, "rescued": 2}) == "ok"
    assert run_record.final_state({"failed": 1, "unreachable": 0}) == "failed"
    assert run_record.final_state({"failed": 1, "unreachable": 1}) == "unreachable"
    assert run_record.run_status({"a": {"state": "ok"}, "b": {"state": "ok"}}) == "ok"
    assert run_record.run_status({"a": {"state": "ok"}, "b": {"state": "unreachable"}}) == "failed"


def test_task_starts_over_many_hosts_are_written_at_most_once_a_second(tmp_path: Path) -> None:
    """Above THROTTLE_ABOVE_HOSTS hosts the record is rewritten at most every THROTTLE_S, and the last start still
    reaches the file within that time."""
    import time

    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

        def get_name(self) -> str:
            return self.name

    callback = run_record.CallbackModule()
    callback._path = str(tmp_path / "record.json")
    callback._record = {"hosts": {}}
    writes: list[float] = []
    original = run_record.write_atomically

    def counting(path: str, record: Any) -> None:
        writes.append(time.monotonic())
        original(path, record)

    run_record.write_atomically = counting
    try:
        hosts = [Named(f"node-{i}") for i in range(run_record.THROTTLE_ABOVE_HOSTS + 50)]
        for task in ("first", "second"):
            for host in hosts:
                callback.v2_runner_on_start(host, Named(task))
        time.sleep(run_record.THROTTLE_S + 0.5)
    finally:
        run_record.write_atomically = original
    # The first 50 starts are written one by one; the next 150 take at most a couple of writes, the last included.
    assert run_record.THROTTLE_ABOVE_HOSTS <= len(writes) <= run_record.THROTTLE_ABOVE_HOSTS + 3
    final = json.loads((tmp_path / "record.json").read_text(encoding="utf-8"))
    assert {entry["last_task"] for entry in final["hosts"].values()} == {"second"}
