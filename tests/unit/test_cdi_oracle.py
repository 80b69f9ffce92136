"""The CDI oracle: CDI specs judged by the CNCF container-device-interface module's own loader (pkg/cdi.ReadSpec,
built by `labctl cdi-validate` from lab/go/cdi-validate). Judged: the spec the nvidia_container_toolkit role writes
to nvidia_container_toolkit_cdi_spec (what `nvidia-ctk cdi generate` prints; in the tests the nvidia-ctk DOUBLE of
tests/molecule/doubles/nvidia-ctk prints it), and the module's own published example specs, read at test time from
the module as the Go module proxy serves it (README.md's and TUTORIAL.md's spec files)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "lab"))
import gobuild  # noqa: E402
from _common import cdi_validate_path  # noqa: E402

# Two H100s as the lab's nvidia-smi double lists them: (index, uuid, driver version).
GPUS = [("0", "GPU-8f3b7a52-1c0e-4b51-9d0c-2f6d9a0e1b11", "580.95.05"),
        ("1", "GPU-2c9d4e61-7a3f-4e8b-b1d2-6e5f0a9c3d22", "580.95.05")]


def oracle() -> Path:
    path = cdi_validate_path()
    if not path.exists():
        pytest.fail(f"the CDI oracle is not at {path}: run `lab/labctl.py cdi-validate` (make unit does) or set "
                    "CDI_VALIDATE")
    return path


def judge(*paths: Path) -> dict[str, dict]:
    """Path name -> the oracle's verdict ({valid, kind, devices, error})."""
    done = subprocess.run([str(oracle()), *map(str, paths)], capture_output=True, text=True, check=False, timeout=60)
    verdicts = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == (0 if all(v["valid"] for v in verdicts) else 1), done.stderr
    assert [v["path"] for v in verdicts] == list(map(str, paths))
    return {Path(v["path"]).name: v for v in verdicts}


def nvidia_ctk_double():
    path = REPO_ROOT / "tests" / "molecule" / "doubles" / "nvidia-ctk"
    loader = importlib.machinery.SourceFileLoader("nvidia_ctk_double", str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def test_the_spec_the_toolkit_role_writes_is_valid_cdi(tmp_path):
    """The role writes `nvidia-ctk cdi generate`'s output as it is; the double prints that output's shape, and the
    DRA driver, containerd and CRI-O resolve the devices by these names."""
    spec = tmp_path / "nvidia.yaml"  # nvidia_container_toolkit_cdi_spec's default name, /etc/cdi/nvidia.yaml
    spec.write_text(nvidia_ctk_double().spec(GPUS))
    verdict = judge(spec)["nvidia.yaml"]
    assert verdict["valid"], verdict["error"]
    assert verdict["kind"] == "nvidia.com/gpu"
    assert verdict["devices"] == ["0", GPUS[0][1], "1", GPUS[1][1], "all"]


def test_the_oracle_refuses_what_the_cdi_loader_refuses(tmp_path):
    good = nvidia_ctk_double().spec(GPUS)
    broken = {
        "no-class.yaml": good.replace("kind: nvidia.com/gpu", "kind: nvidia.com"),
        "twice.yaml": good.replace('name: "1"', 'name: "0"'),
        "unknown-key.yaml": good.replace("cdiVersion: 0.5.0", "cdiVersion: 0.5.0\nvendorNotes: x"),
        "bad-hook.yaml": good.replace("hookName: createContainer", "hookName: beforeStart", 1),
    }
    for name, text in broken.items():
        assert text != good, name
        (tmp_path / name).write_text(text)
    verdicts = judge(*(tmp_path / name for name in broken))
    assert {name: v["valid"] for name, v in verdicts.items()} == dict.fromkeys(broken, False)
    assert "multiple device \"0\"" in verdicts["twice.yaml"]["error"]
    assert "field vendorNotes not found" in verdicts["unknown-key.yaml"]["error"]
    assert "beforeStart" in verdicts["bad-hook.yaml"]["error"]


# The spec files the module's own documents write (`cat > /etc/cdi/NAME <<EOF ... EOF`, `tee /etc/cdi/NAME << 'X'`).
HEREDOC = re.compile(r"(?:cat >|tee) /etc/cdi/(?P<name>\S+) <<\s*'?(?P<end>\w+)'?\n(?P<body>.*?)\n\s*(?P=end)\n", re.S)
# What the module's own loader says of them: README.md's annotations example is not JSON (its "annotations" and
# the following key lack commas), so CDI refuses it as it stands; the other two are valid.
UPSTREAM_VERDICTS = {"vendor.json": True, "vendor-annotations.json": False, "tutorial.yaml": True}


def test_the_cdi_modules_published_example_specs(tmp_path):
    source = gobuild.module_source("cdi-validate")  # the pinned module from the module cache (go.sum checked)
    written = []
    for document in ("README.md", "TUTORIAL.md"):
        for match in HEREDOC.finditer((source / document).read_text(encoding="utf-8")):
            path = tmp_path / match["name"]
            path.write_text(textwrap.dedent(match["body"]) + "\n")
            written.append(path)
    verdicts = judge(*written)
    assert {name: v["valid"] for name, v in verdicts.items()} == UPSTREAM_VERDICTS
    assert verdicts["vendor.json"]["kind"] == "vendor.com/device"
    assert verdicts["tutorial.yaml"]["devices"] == ["read-write", "read-only"]
