"""roles/drift_schedule's CronJob method against the lab's real API server: the namespace (Pod Security restricted),
the runner's service account and RBAC (no delete verb anywhere, Secrets in the listed namespaces only), the reports
volume, the inventory Secret and the CronJob (one run at a time); a Job made from the CronJob gets a pod that
restricted admission accepts; a second run and a check run change nothing; bad input is refused before any change.
The pod itself cannot run here (kwok nodes run no containers): test_main_job.py runs a drift check with this service
account's own token instead, which proves its RBAC is enough."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from conftest import Lab, delete_test_namespaces, recap_changed, run_playbook, wait_for

SA = "gpu-drift"


def pod_inventory(tmp: Path) -> Path:
    """An inventory written for the pod: the control host is the pod itself, using its service account."""
    inventory = tmp / "pod-inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text(json.dumps({"all": {"children": {
        "gpu_nodes": {"hosts": {}},
        "cluster_control": {"hosts": {"localhost": {"ansible_connection": "local",
                                                    "ansible_python_interpreter": "/usr/bin/python3"}}}}}}))
    (inventory / "group_vars" / "all.yml").write_text("gpu_drift_policy:\n  quota: repair\n")
    return inventory


def schedule_args(namespace: str, secret_namespace: str, inventory: Path, **extra: object) -> tuple[str, ...]:
    settings = {"drift_schedule_method": "cronjob", "drift_schedule_namespace": namespace,
                "drift_schedule_inventories": [str(inventory)], "drift_schedule_secret_namespaces": [secret_namespace],
                "drift_schedule_schedule": "*/30 * * * *", **extra}
    return ("-e", json.dumps(settings))


def kubectl(lab: Lab, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "--kubeconfig", str(lab.kubeconfig), *args], capture_output=True, text=True,
                          check=check, timeout=120)


@pytest.fixture(scope="module")
def scheduled(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("drift-schedule")
    names = [f"it-drift-{tmp.name[-6:].lower().replace('_', '')}", f"it-secrets-{tmp.name[-6:].lower().replace('_', '')}"]
    namespace, secret_namespace = names
    # The Secret namespace exists first (the role refuses one that does not); the role makes its own namespace.
    lab.core.create_namespace({"metadata": {"name": secret_namespace, "labels": {"gpu-lab.dev/test": "true"}}})
    inventory = pod_inventory(tmp)
    args = ("-i", "inventories/lab/hosts.yml", *schedule_args(namespace, secret_namespace, inventory))
    check_first = run_playbook(lab, "drift_schedule.yml", "--check", *args)
    first = run_playbook(lab, "drift_schedule.yml", *args)
    # Every object the role made is marked as a test's, so an interrupted session's leftovers are cleaned up.
    kubectl(lab, "label", "namespace", namespace, "gpu-lab.dev/test=true", check=False)
    again = run_playbook(lab, "drift_schedule.yml", *args)
    check = run_playbook(lab, "drift_schedule.yml", "--check", *args)
    yield {"namespace": namespace, "secret_namespace": secret_namespace, "inventory": inventory, "args": args,
           "check_first": check_first, "first": first, "again": again, "check": check}
    kubectl(lab, "delete", "clusterrole,clusterrolebinding", SA, "--ignore-not-found", check=False)
    # Gone before the next test file starts: a namespace still terminating would move under its feet.
    delete_test_namespaces(lab, names)


def test_check_on_a_fresh_cluster_predicts_and_creates_nothing(scheduled, lab: Lab):
    rc, output = scheduled["check_first"]
    assert rc == 0, output[-3000:]
    assert "(predicted) would create the drift runner's service account" in output, output[-3000:]
    assert "(predicted) would create the inventory Secret" in output, output[-3000:]


def test_applies_then_changes_nothing(scheduled):
    for name in ("first", "again", "check"):
        rc, output = scheduled[name]
        assert rc == 0, (name, output[-3000:])
    assert recap_changed(scheduled["first"][1]) > 0
    assert recap_changed(scheduled["again"][1]) == 0, scheduled["again"][1][-3000:]
    assert recap_changed(scheduled["check"][1]) == 0, scheduled["check"][1][-3000:]


def test_inventory_secret_is_never_printed(scheduled):
    assert "quota: repair" not in scheduled["first"][1]
    assert "Z3B1X2RyaWZ0" not in scheduled["first"][1]  # base64 of "gpu_drift"


def test_cronjob_runs_one_at_a_time_as_its_own_service_account(scheduled, lab: Lab):
    cronjob = lab.batch.read_namespaced_cron_job(SA, scheduled["namespace"])
    assert cronjob.spec.concurrency_policy == "Forbid" and cronjob.spec.schedule == "*/30 * * * *"
    pod = cronjob.spec.job_template.spec.template.spec
    assert pod.service_account_name == SA and pod.restart_policy == "Never"
    (container,) = pod.containers
    command = container.command
    assert command[:2] == ["/bin/sh", "-c"], command
    assert command[3].endswith("/gpu_ops/cluster/runner/gpu_ops_drift.py"), command
    assert command[4:] == ["check", "-i", "/runner/inventories/0", "--reports", "/runner/reports", "--timeout", "1800"]
    mounts = {m.mount_path: m for m in container.volume_mounts}
    assert mounts["/runner/inventories"].read_only and "/runner/reports" in mounts
    volumes = {v.name: v for v in pod.volumes}
    assert volumes["reports"].persistent_volume_claim.claim_name == "gpu-drift-reports"
    paths = {item.path for item in volumes["inventory"].secret.items}
    assert paths == {"0/hosts.yml", "0/group_vars/all.yml"}, paths
    secret = lab.core.read_namespaced_secret("gpu-drift-inventory", scheduled["namespace"])
    assert len(secret.data) == 2


def test_a_job_from_the_cronjob_is_admitted_under_restricted(scheduled, lab: Lab):
    namespace = scheduled["namespace"]
    labels = lab.core.read_namespace(namespace).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    kubectl(lab, "-n", namespace, "create", "job", "--from=cronjob/gpu-drift", "drift-now")

    def pod():
        pods = lab.core.list_namespaced_pod(namespace, label_selector="job-name=drift-now").items
        return pods[0] if pods else None

    created = wait_for(pod, 60, "the Job's pod (the Job controller creates it; Pod Security admission judges it)")
    assert created.spec.security_context.run_as_non_root is True
    events = kubectl(lab, "-n", namespace, "get", "events", "-o", "json").stdout
    assert "violates PodSecurity" not in events


CAN = [("patch", "configmaps", "gpu-monitoring"), ("create", "namespaces", ""), ("patch", "nodes", ""),
       ("patch", "clusterroles", ""), ("escalate", "roles", "nlp"), ("patch", "networkpolicies", "vision"),
       ("get", "customresourcedefinitions", "")]
CANNOT = [("delete", "configmaps", "gpu-monitoring"), ("delete", "namespaces", ""), ("delete", "nodes", ""),
          ("delete", "resourcequotas", "vision"), ("get", "secrets", "kube-system"), ("create", "pods/exec", "default"),
          ("create", "pods", "default"), ("patch", "customresourcedefinitions", "")]


@pytest.mark.parametrize("verb, resource, where", CAN + CANNOT,
                         ids=[f"{'can' if (v, r, w) in CAN else 'cannot'}-{v}-{r}" for v, r, w in CAN + CANNOT])
def test_the_service_account_may_do_what_the_roles_do_and_never_delete(scheduled, lab: Lab, verb, resource, where):
    who = f"system:serviceaccount:{scheduled['namespace']}:{SA}"
    args = ["auth", "can-i", verb, resource, "--as", who] + (["-n", where] if where else [])
    answer = kubectl(lab, *args, check=False).stdout.strip()
    assert answer == ("yes" if (verb, resource, where) in CAN else "no"), (verb, resource, where, answer)


def test_secrets_only_in_the_listed_namespaces(scheduled, lab: Lab):
    who = f"system:serviceaccount:{scheduled['namespace']}:{SA}"
    assert kubectl(lab, "auth", "can-i", "get", "secrets", "-n", scheduled["secret_namespace"], "--as", who,
                   check=False).stdout.strip() == "yes"
    assert kubectl(lab, "auth", "can-i", "delete", "secrets", "-n", scheduled["secret_namespace"], "--as", who,
                   check=False).stdout.strip() == "no"


def cronjob_as_applied(lab: Lab, namespace: str) -> tuple:
    """What a run of the role could change on the CronJob: its generation, labels, annotations and spec. Not its
    resourceVersion: the CronJob controller bumps that when the schedule fires (every :00 and :30) and records the
    Job in the status, which made the refusal tests fail at random."""
    cronjob = lab.batch.read_namespaced_cron_job(SA, namespace)
    return (cronjob.metadata.generation, cronjob.metadata.labels, cronjob.metadata.annotations, cronjob.spec.to_dict())


@pytest.mark.parametrize("extra, message", [
    ({"drift_schedule_schedule": "every hour"}, "drift_schedule_schedule='every hour'; allowed: five cron fields"),
    ({"drift_schedule_image": "Not An Image"}, "drift_schedule_image='Not An Image'; allowed: an image reference"),
    ({"drift_schedule_reports_size": "lots"}, "drift_schedule_reports_size='lots'; allowed: a Kubernetes quantity"),
    ({"drift_schedule_inventories": ["/nonexistent/inventory"]},
     'drift_schedule_inventories[0]="/nonexistent/inventory": no file or directory there'),
    ({"drift_schedule_secret_namespaces": ["no-such-namespace-here"]}, "no namespace no-such-namespace-here"),
], ids=["schedule", "image", "size", "inventory", "secret-namespace"])
def test_bad_input_is_refused_before_any_change(scheduled, lab: Lab, extra, message):
    before = cronjob_as_applied(lab, scheduled["namespace"])
    args = ("-i", "inventories/lab/hosts.yml",
            *schedule_args(scheduled["namespace"], scheduled["secret_namespace"], scheduled["inventory"], **extra))
    rc, output = run_playbook(lab, "drift_schedule.yml", *args)
    flat = " ".join(output.split())
    assert rc != 0 and message in flat, flat[-3000:]
    assert cronjob_as_applied(lab, scheduled["namespace"]) == before
