"""CDI on a host whose GPUs nvidia-ctk can see: the spec is written from nvidia-ctk's own output, kept while the driver
stays, and regenerated when the driver version changes; check mode predicts each step.

Molecule's containers have no GPU, so this test puts two doubles in front of the real tools for its duration: the
lab's nvidia-smi double (lab/doubles/nvidia-smi, two H200s) and a double of `nvidia-ctk cdi generate`
(tests/molecule/doubles/nvidia-ctk; every other nvidia-ctk call reaches the real binary). Everything else is real: the
role, the toolkit it installed, containerd and Docker. The host is put back as it was afterwards, since the other
tests of this scenario check the "no GPU" outcome.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "molecule"))

from playbook_run import changed_tasks  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
CONVERGE = ROOT / "molecule" / "_shared" / "container_toolkit" / "converge.yml"
HOST = "ctk-debian12"
SPEC = "/etc/cdi/nvidia.yaml"
FACT = "/etc/ansible/facts.d/nvidia_container_toolkit.fact"
DESCRIPTION = "/etc/gpu-lab/gpus.json"
WRITE_SPEC = "Write the CDI spec"
RECORD = "Record the toolkit version, runtimes and CDI driver version"


def describe_gpus(host, driver_version: str) -> None:
    description = {"product": "NVIDIA H200", "count": 2, "driver_version": driver_version, "node": HOST}
    host.run_expect([0], f"mkdir -p /etc/gpu-lab && echo '{json.dumps(description)}' > {DESCRIPTION}")


def short_names(names: list[str]) -> set[str]:
    return {name.split(" : ", 1)[-1] for name in names}


@pytest.fixture()
def gpus_visible(host):
    """The doubles in /usr/local/bin, the fact file kept; afterwards the host as it was, without a spec."""
    assert not host.file(SPEC).exists, "the scenario's converge should not have written a CDI spec"
    host.run_expect([0], f"cp -p {FACT} /root/ctk.fact.keep")
    for source, target in ((ROOT / "lab" / "doubles" / "nvidia-smi", "/usr/local/bin/nvidia-smi"),
                           (ROOT / "tests" / "molecule" / "doubles" / "nvidia-ctk", "/usr/local/bin/nvidia-ctk")):
        subprocess.run(["podman", "cp", str(source), f"{HOST}:{target}"], check=True)
        host.run_expect([0], f"chown root:root {target} && chmod 0755 {target}")
    yield
    host.run_expect([0], f"rm -rf /usr/local/bin/nvidia-smi /usr/local/bin/nvidia-ctk /etc/gpu-lab /etc/cdi && "
                         f"mv /root/ctk.fact.keep {FACT}")


def recorded(host) -> dict:
    return json.loads(host.file(FACT).content_string)


def test_cdi_spec_follows_the_driver(host, gpus_visible):
    describe_gpus(host, "570.86.15")
    predicted = short_names(changed_tasks(CONVERGE, HOST, check=True))
    assert WRITE_SPEC in predicted and RECORD in predicted, predicted
    assert not host.file(SPEC).exists, "check mode wrote the spec"

    assert short_names(changed_tasks(CONVERGE, HOST)) == predicted
    spec = host.file(SPEC)
    assert spec.mode == 0o644 and spec.user == "root"
    # What the role wrote is nvidia-ctk's own output, whole.
    assert spec.content_string == host.check_output("nvidia-ctk --quiet cdi generate") + "\n"
    assert "libcuda.so.570.86.15" in spec.content_string
    assert recorded(host)["cdi_driver_version"] == "570.86.15" and recorded(host)["cdi_spec"] == SPEC

    # A driver upgrade: check mode predicts the rewrite, the run rewrites it, and the next run changes nothing.
    describe_gpus(host, "580.126.09")
    predicted = short_names(changed_tasks(CONVERGE, HOST, check=True))
    assert predicted == {WRITE_SPEC, RECORD}, predicted
    assert "libcuda.so.570.86.15" in host.file(SPEC).content_string
    assert short_names(changed_tasks(CONVERGE, HOST)) == predicted
    assert "libcuda.so.580.126.09" in host.file(SPEC).content_string
    assert "570.86.15" not in host.file(SPEC).content_string
    assert recorded(host)["cdi_driver_version"] == "580.126.09"
    assert changed_tasks(CONVERGE, HOST) == []
