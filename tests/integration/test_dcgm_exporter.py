"""roles/dcgm_exporter against the lab's real API server: placement on exactly the GPU nodes, the counters, the
Service, idempotence, and bad counters refused before any change. The ServiceMonitor (a Prometheus Operator's stack,
with its real CRDs) is test_monitoring_operator.py's."""

from __future__ import annotations

import json
import re

import pytest

from conftest import Lab, recap_changed, run_playbook, wait_for

NAMESPACE = "gpu-monitoring"
LAB_INVENTORY = "inventories/lab/hosts.yml"
# This role's tasks only: the whole cluster.yml's idempotence is test_main_job's (a check run right after site.yml).
EXPORTER = ("-i", LAB_INVENTORY, "--tags", "dcgm_exporter")


@pytest.fixture(scope="module")
def deployed(lab: Lab):
    rc, output = run_playbook(lab, "cluster.yml", "-i", LAB_INVENTORY)
    assert rc == 0, output[-3000:]
    return output


def test_exporter_runs_on_exactly_the_gpu_nodes_behind_a_service(lab: Lab, deployed):
    def ready():
        status = lab.apps.read_namespaced_daemon_set_status("dcgm-exporter", NAMESPACE).status
        return status.desired_number_scheduled and status.number_ready == status.desired_number_scheduled

    wait_for(ready, 90, "the exporter pods to be Ready")
    pods = lab.core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=dcgm-exporter").items
    assert sorted(p.spec.node_name for p in pods) == sorted(lab.config.gpu_nodes())
    context = pods[0].spec.containers[0].security_context
    assert context.capabilities.add == ["SYS_ADMIN"] and context.capabilities.drop == ["ALL"]
    assert not context.privileged
    service = lab.core.read_namespaced_service("dcgm-exporter", NAMESPACE)
    assert [(p.name, p.port) for p in service.spec.ports] == [("metrics", 9400)]
    counters = lab.core.read_namespaced_config_map("dcgm-exporter-counters", NAMESPACE).data["counters.csv"]
    for field in ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_POWER_VIOLATION",
                  "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_FB_TOTAL"):
        assert f"\n{field}, " in counters


def test_second_run_and_check_mode_change_nothing(lab: Lab, deployed):
    for mode in ((), ("--check",)):
        rc, output = run_playbook(lab, "cluster.yml", *EXPORTER, *mode)
        assert rc == 0 and recap_changed(output) == 0, output[-3000:]


def test_bad_counters_fail_before_any_change(lab: Lab, deployed):
    before = lab.core.read_namespaced_config_map("dcgm-exporter-counters", NAMESPACE).metadata.resource_version
    extra = [{"field": "GPU_TEMP", "type": "gauge", "help": "x"}, {"field": "DCGM_FI_DEV_GPU_TEMP", "type": "gauge",
                                                                   "help": "again"}]
    rc, output = run_playbook(lab, "cluster.yml", "-i", LAB_INVENTORY,
                              "-e", json.dumps({"dcgm_exporter_extra_counters": extra}))
    assert rc != 0, output[-3000:]
    assert "field='GPU_TEMP'; allowed: a DCGM field name" in output
    assert "field='DCGM_FI_DEV_GPU_TEMP' repeats counter[3]" in output
    assert lab.core.read_namespaced_config_map("dcgm-exporter-counters", NAMESPACE).metadata.resource_version == before


def test_quoted_boolean_fails_before_any_change(lab: Lab, deployed):
    """"false" passes the argument spec as a bool but reads as true in the DaemonSet template: refused."""
    before = lab.apps.read_namespaced_daemon_set("dcgm-exporter", NAMESPACE).metadata.resource_version
    rc, output = run_playbook(lab, "cluster.yml", "-i", LAB_INVENTORY,
                              "--tags", "dcgm_exporter_preflight,dcgm_exporter_apply",
                              "-e", json.dumps({"dcgm_exporter_pod_attribution": "false"}))
    assert rc != 0, output[-3000:]
    assert 'dcgm_exporter_pod_attribution="false" is not a boolean (str)' in " ".join(output.split()), output[-3000:]
    assert lab.apps.read_namespaced_daemon_set("dcgm-exporter", NAMESPACE).metadata.resource_version == before


@pytest.mark.parametrize("tag", ["dcgm_exporter", "dcgm_exporter_apply"])
def test_the_role_and_its_apply_phase_run_alone_by_tag(lab: Lab, deployed, tag: str):
    """`--tags <role>` runs that role only; `--tags <role>_apply` still runs its preflight (which the apply phase
    needs) and a bad input given then is still refused before anything changes."""
    rc, output = run_playbook(lab, "cluster.yml", "-i", LAB_INVENTORY, "--tags", tag)
    assert rc == 0 and recap_changed(output) == 0, output[-3000:]
    # Another role shows only its argument check (Ansible runs that whatever the tags); none of its tasks run.
    others = re.findall(r"^TASK \[gpu_ops\.cluster\.(?!dcgm_exporter|_common)(\w+) : (?!Validating arguments)", output,
                        re.MULTILINE)
    assert "dcgm_exporter : Check" in output and others == [], output[-3000:]
    rc, output = run_playbook(lab, "cluster.yml", "-i", LAB_INVENTORY, "--tags", tag,
                              "-e", json.dumps({"dcgm_exporter_pod_attribution": "false"}))
    assert rc != 0 and 'dcgm_exporter_pod_attribution="false" is not a boolean' in " ".join(output.split())


def test_switched_off_the_role_changes_nothing_even_with_new_settings(lab: Lab, deployed):
    """dcgm_exporter_enabled=false (a cluster with its own exporter): a settings change that would roll the exporter
    is not applied, the exporter the role applied before stays, and the run says why; a quoted "false" is refused."""
    before = lab.core.read_namespaced_config_map("dcgm-exporter-counters", NAMESPACE).metadata.resource_version
    extra = [{"field": "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "type": "gauge", "help": "FP64 pipe activity."}]
    rc, output = run_playbook(lab, "cluster.yml", "-i", LAB_INVENTORY, "--tags", "dcgm_exporter",
                              "-e", json.dumps({"dcgm_exporter_enabled": False, "dcgm_exporter_extra_counters": extra}))
    assert rc == 0 and recap_changed(output) == 0, output[-3000:]
    assert "dcgm_exporter_enabled=false: the dcgm_exporter role changes nothing in the cluster" in " ".join(output.split())
    assert lab.core.read_namespaced_config_map("dcgm-exporter-counters", NAMESPACE).metadata.resource_version == before
    assert lab.apps.read_namespaced_daemon_set("dcgm-exporter", NAMESPACE) is not None

    rc, output = run_playbook(lab, "cluster.yml", "-i", LAB_INVENTORY, "--tags", "dcgm_exporter",
                              "-e", json.dumps({"dcgm_exporter_enabled": "false"}))
    assert rc != 0 and 'dcgm_exporter_enabled="false" is not a boolean (str)' in " ".join(output.split())
