"""The collection as a user consumes it: `ansible-galaxy collection build` makes the tarball, it is installed into an
empty collections path (offline: its dependencies come from the ansible bundle, as Galaxy is unreachable here), and
from an empty directory, without the project's ansible.cfg, roles or plugins paths, a playbook that names only FQCNs
provisions the lab's cluster (the cluster roles) and validates it; then the collection's own validate playbook runs by
its FQCN (`gpu_ops.cluster.validate`). Both must come from the installed copy, not from the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from conftest import ROOT, Lab, consumer_inventory

COLLECTION = "gpu_ops.cluster"

CONSUMER_PLAYBOOK = """\
---
- name: GPU stack from the installed collection
  hosts: cluster_control
  gather_facts: false
  roles:
    - role: gpu_ops.cluster.gpu_scheduling
    - role: gpu_ops.cluster.nvidia_device_plugin
    - role: gpu_ops.cluster.dcgm_exporter
  tasks:
    - name: Read a filter of the collection
      ansible.builtin.assert:
        that: "{'consumer_flag': true, 'quoted_flag': 'yes'} | gpu_ops.cluster.bool_input_problems | length == 1"

    - name: Check the cluster
      ansible.builtin.include_role:
        name: gpu_ops.cluster.gpu_validation
        tasks_from: cluster
      vars:
        gpu_validation_sharing_configs: "{{ nvidia_device_plugin_configs }}"
        gpu_validation_default_sharing_config: "{{ nvidia_device_plugin_default_config }}"

    - name: Write the report and the verdict
      ansible.builtin.include_role:
        name: gpu_ops.cluster.gpu_validation
        tasks_from: report
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The built tarball installed into an empty collections path; a consumer directory with only an inventory."""
    tmp = tmp_path_factory.mktemp("collection")
    dist, collections, consumer = tmp / "dist", tmp / "collections", tmp / "consumer"
    for path in (dist, collections, consumer):
        path.mkdir()
    galaxy = str(ROOT / ".venv" / "bin" / "ansible-galaxy")
    build = subprocess.run([galaxy, "collection", "build", "--output-path", str(dist)], cwd=ROOT, text=True,
                           capture_output=True, check=False, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    (tarball,) = dist.glob("gpu_ops-cluster-*.tar.gz")
    # Offline: the dependencies (kubernetes.core, community.general) are found in the ansible bundle. --force because
    # the checkout itself is visible as gpu_ops.cluster through the virtualenv's link (`make setup`).
    install = subprocess.run([galaxy, "collection", "install", "--offline", "--force", "-p", str(collections),
                              str(tarball)], cwd=consumer, text=True, capture_output=True, check=False, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update({"ANSIBLE_COLLECTIONS_PATH": str(collections), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_HOST_KEY_CHECKING": "0",
                "PATH": f"{ROOT / '.venv' / 'bin'}:{env['PATH']}"})
    yield {"tarball": tarball, "collections": collections, "consumer": consumer, "env": env,
           "root": collections / "ansible_collections" / "gpu_ops" / "cluster"}
    shutil.rmtree(tmp, ignore_errors=True)


def run_in_consumer(installed: dict, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=installed["consumer"], env=installed["env"], text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False, timeout=timeout)


def test_the_tarball_holds_the_collection_and_not_the_lab(installed: dict) -> None:
    with tarfile.open(installed["tarball"]) as archive:
        names = set(archive.getnames())
    manifest = json.loads((installed["root"] / "MANIFEST.json").read_text(encoding="utf-8"))
    assert manifest["collection_info"]["namespace"] == "gpu_ops" and manifest["collection_info"]["name"] == "cluster"
    for wanted in ("MANIFEST.json", "FILES.json", "meta/runtime.yml", "playbooks/site.yml", "roles/nvidia_driver/tasks/main.yml",
                   "plugins/modules/nvidia_gpu_facts.py", "plugins/module_utils/nvidia_gpu.py",
                   "plugins/filter/tenancy.py", "plugins/callback/run_record.py"):
        assert wanted in names, wanted
    for unwanted in ("lab", "molecule", "tests", "bench", "Makefile", "ansible.cfg", ".venv", ".cache"):
        assert not any(name == unwanted or name.startswith(unwanted + "/") for name in names), unwanted


def test_the_installed_copy_is_the_one_ansible_uses(installed: dict) -> None:
    doc = run_in_consumer(installed, "ansible-doc", "--json", "-t", "module", f"{COLLECTION}.nvidia_gpu_facts")
    assert doc.returncode == 0, doc.stdout
    (entry,) = json.loads(doc.stdout).values()
    assert Path(entry["doc"]["filename"]).is_relative_to(installed["root"]), entry["doc"]["filename"]


def test_a_playbook_of_fqcns_provisions_and_validates_the_lab_cluster(installed: dict, lab: Lab) -> None:
    consumer = installed["consumer"]
    (consumer / "inventory.yml").write_text(yaml.safe_dump(consumer_inventory(lab, str(ROOT / ".venv" / "bin" / "python")),
                                                                  sort_keys=False), encoding="utf-8")
    (consumer / "gpu.yml").write_text(CONSUMER_PLAYBOOK, encoding="utf-8")
    run = run_in_consumer(installed, "ansible-playbook", "-i", "inventory.yml", "gpu.yml")
    assert run.returncode == 0, run.stdout[-6000:]
    # The reports land where the user ran it, not inside the installed collection.
    report = json.loads((consumer / "reports" / "validation.json").read_text(encoding="utf-8"))
    assert report["passed"], report["problems"]
    assert set(report["cluster"]["nodes"]) == set(lab.config.host_nodes())
    assert not list(installed["root"].rglob("reports"))

    # The collection's own playbook by its FQCN (the cluster side: the node containers are not this test's). Its
    # tasks on localhost run in its own directory, inside the installed collection: the report must still come here.
    (consumer / "reports" / "validation.txt").unlink()
    validate = run_in_consumer(installed, "ansible-playbook", "-i", "inventory.yml", f"{COLLECTION}.validate",
                               "--limit", "cluster_control", "-e", "gpu_validation_smoke_test=false")
    assert validate.returncode == 0, validate.stdout[-6000:]
    assert "Verdict: PASSED" in (consumer / "reports" / "validation.txt").read_text(encoding="utf-8")
    assert not list(installed["root"].rglob("reports")), "a report was written inside the installed collection"
