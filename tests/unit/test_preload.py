"""plugins/callback/preload.py: the collection's filter plugins imported in the main process, before workers fork."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from conftest import REPO_ROOT

FILTERS = sorted(path.stem for path in (REPO_ROOT / "plugins" / "filter").glob("*.py") if path.stem != "__init__")

PLAYBOOK = """\
- name: What a worker finds already imported
  hosts: localhost
  gather_facts: false
  tasks:
    - name: The collection's filter modules in this task's worker, which uses none of them
      ansible.builtin.debug:
        msg: "{{ lookup('gpu_ops_preload_probe') }}"
"""

PROBE = textwrap.dedent("""\
    import json
    import os
    import sys

    from ansible.plugins.lookup import LookupBase


    class LookupModule(LookupBase):
        def run(self, terms, variables=None, **kwargs):
            prefix = "ansible_collections.gpu_ops.cluster.plugins.filter."
            found = sorted(name[len(prefix):] for name in sys.modules if name.startswith(prefix))
            with open(os.environ["PRELOAD_PROBE_OUT"], "w", encoding="utf-8") as out:
                json.dump(found, out)
            return ["written"]
    """)


def run_probe(tmp_path, callbacks: str) -> list:
    (tmp_path / "lookup_plugins").mkdir()
    (tmp_path / "lookup_plugins" / "gpu_ops_preload_probe.py").write_text(PROBE, encoding="utf-8")
    (tmp_path / "playbook.yml").write_text(PLAYBOOK, encoding="utf-8")
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "ANSIBLE_CALLBACKS_ENABLED": callbacks,
           "ANSIBLE_LOOKUP_PLUGINS": str(tmp_path / "lookup_plugins"), "ANSIBLE_NOCOLOR": "1",
           "PRELOAD_PROBE_OUT": str(tmp_path / "found.json")}
    result = subprocess.run([str(REPO_ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                             "-e", "ansible_python_interpreter=" + sys.executable, str(tmp_path / "playbook.yml")],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return json.loads((tmp_path / "found.json").read_text(encoding="utf-8"))


def test_a_worker_finds_every_filter_module_imported(tmp_path):
    assert run_probe(tmp_path, "gpu_ops.cluster.preload") == FILTERS


def test_without_it_a_worker_starts_with_none(tmp_path):
    """The probe can tell: without the callback, the worker has imported none of them when the task starts."""
    assert run_probe(tmp_path, "gpu_ops.cluster.run_record") == []


def test_the_project_configuration_enables_it():
    config = (REPO_ROOT / "ansible.cfg").read_text(encoding="utf-8")
    enabled = next(line for line in config.splitlines() if line.startswith("callbacks_enabled"))
    assert "gpu_ops.cluster.preload" in enabled
