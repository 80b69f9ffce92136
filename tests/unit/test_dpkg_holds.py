"""The batched dpkg selection module: what it reads from `dpkg --get-selections`, what it changes, and that the drift
runner names the packages it changed (one task for all packages replaced a dpkg_selections loop per package)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import REPO_ROOT, load_ansible_module, load_source

holds = load_ansible_module("dpkg_holds")
load_source("gpu_ops_run", REPO_ROOT / "runner" / "gpu_ops_run.py")
drift = load_source("gpu_ops_drift", REPO_ROOT / "runner" / "gpu_ops_drift.py")

RECORDED = "nvidia-driver\t\t\t\t\thold\nnvidia-smi:amd64\t\t\t\tinstall\nlibcuda1\t\t\t\t\tdeinstall\n"


def test_selections_are_read_with_and_without_an_architecture():
    assert holds.parse_selections(RECORDED) == {"nvidia-driver": "hold", "nvidia-smi": "install", "libcuda1": "deinstall"}
    assert holds.parse_selections("") == {}


def test_only_packages_at_another_selection_change_and_unknown_ones_are_named():
    current = holds.parse_selections(RECORDED)
    assert holds.plan(["nvidia-driver", "nvidia-smi", "libcuda1", "missing", "nvidia-smi"], "hold", current) == (
        ["nvidia-smi", "libcuda1"], ["missing"])
    assert holds.plan(["nvidia-driver"], "hold", current) == ([], [])
    assert holds.plan(["nvidia-driver", "nvidia-smi"], "install", current) == (["nvidia-driver"], [])


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="dpkg is not installed here")
def test_the_recorded_format_is_what_dpkg_prints():
    installed = subprocess.run(["dpkg-query", "-W", "-f=${Package}\n", "dpkg"], capture_output=True, text=True,
                               check=True).stdout.strip()
    out = subprocess.run(["dpkg", "--get-selections", installed], capture_output=True, text=True, check=True).stdout
    assert holds.parse_selections(out)[installed] in ("install", "hold")


def test_the_drift_report_names_the_packages_the_task_changed():
    result = {"changed": True, "changed_packages": ["nvidia-smi"],
              "invocation": {"module_args": {"names": ["nvidia-driver", "nvidia-smi"], "selection": "hold"}}}
    assert drift.resource_of(result) == "nvidia-smi"
