"""A kubeconfig that cannot do the job is refused before any change, with the reason (issue 21, Faults).

Three bad kubeconfigs made from the lab's real PKI (lab/pki.py): the server's CA replaced by another one, a client
certificate signed by the lab's CA that expired two days ago, and a user the API server authenticates but whose RBAC
allows only get, list and watch. `playbooks/cluster.yml` with each must fail in its first play (cluster_access.yml),
name the reason (for RBAC every missing verb and resource, from the SelfSubjectAccessReviews), and leave the cluster as
it was: every object the cluster roles own, the GPU nodes' labels, and a user's ConfigMap in a role's namespace.
"""

from __future__ import annotations

import datetime
import re
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

import pki
from conftest import TEST_LABEL, Lab, recap_changed, run_playbook

# The cluster roles' namespaces (lab inventory and defaults) and their cluster-scoped objects' kinds.
ROLE_NAMESPACES = ("nvidia-device-plugin", "gpu-monitoring", "monitoring")
NAMESPACED = (("v1", "ConfigMap"), ("v1", "Secret"), ("v1", "ServiceAccount"), ("v1", "Service"),
              ("apps/v1", "DaemonSet"), ("apps/v1", "Deployment"), ("rbac.authorization.k8s.io/v1", "Role"),
              ("rbac.authorization.k8s.io/v1", "RoleBinding"))
CLUSTER_SCOPED = (("v1", "Namespace"), ("node.k8s.io/v1", "RuntimeClass"),
                  ("rbac.authorization.k8s.io/v1", "ClusterRole"), ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
                  ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
                  ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"))


def _ca(lab: Lab) -> Tuple[object, x509.Certificate, str]:
    pki_dir = lab.paths.admin_kubeconfig.parent
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    server = yaml.safe_load(lab.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    return ca_key, ca_cert, server


def _write(path: Path, server: str, ca_cert: x509.Certificate, key: object, cert: x509.Certificate, user: str) -> Path:
    path.write_text(pki.kubeconfig("gpu-lab", server, pki._pem_cert(ca_cert), pki._pem_cert(cert), pki._pem_key(key),
                                   user), encoding="utf-8")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def bad_kubeconfigs(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Path]]:
    """wrong-ca, expired and read-only kubeconfigs; the read-only user's ClusterRole and binding removed afterwards."""
    tmp = tmp_path_factory.mktemp("kubeconfigs")
    ca_key, ca_cert, server = _ca(lab)
    _, other_ca = pki.make_ca("not-the-gpu-lab-ca")
    admin_key, admin_cert = pki.issue(ca_key, ca_cert, "gpu-lab-admin", groups=("system:masters",))
    expired_key, expired_cert = pki.issue(ca_key, ca_cert, "gpu-lab:expired", groups=("system:masters",),
                                          not_after=pki._now() - datetime.timedelta(days=2))
    reader = f"gpu-lab:reader-{uuid.uuid4().hex[:6]}"
    reader_key, reader_cert = pki.issue(ca_key, ca_cert, reader)
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(lab.api_client)
    name = f"it-{reader.split(':')[1]}"
    rbac.create_cluster_role({"metadata": {"name": name, "labels": {TEST_LABEL: "true"}},
                              "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]})
    rbac.create_cluster_role_binding({
        "metadata": {"name": name, "labels": {TEST_LABEL: "true"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": reader}]})
    yield {
        "wrong-ca": _write(tmp / "wrong-ca.kubeconfig", server, other_ca, admin_key, admin_cert, "gpu-lab-admin"),
        "expired": _write(tmp / "expired.kubeconfig", server, ca_cert, expired_key, expired_cert, "gpu-lab:expired"),
        "read-only": _write(tmp / "read-only.kubeconfig", server, ca_cert, reader_key, reader_cert, reader),
        "reader": reader,  # type: ignore[dict-item]
        "expired_on": expired_cert.not_valid_after_utc.strftime("%Y-%m-%d %H:%M:%S UTC"),  # type: ignore[dict-item]
    }
    rbac.delete_cluster_role_binding(name)
    rbac.delete_cluster_role(name)


@pytest.fixture(scope="module")
def user_config_map(lab: Lab) -> Iterator[Tuple[str, str]]:
    """A user's ConfigMap in the Prometheus role's namespace (made for the test when the namespace is not there yet,
    as on a lab where site.yml has not run)."""
    made_namespace = False
    try:
        lab.core.read_namespace("monitoring")
    except Exception:  # noqa: BLE001 - any miss means: make it, and delete it afterwards
        lab.core.create_namespace({"metadata": {"name": "monitoring", "labels": {TEST_LABEL: "true"}}})
        made_namespace = True
    name = f"users-notes-{uuid.uuid4().hex[:6]}"
    lab.core.create_namespaced_config_map("monitoring", {"metadata": {"name": name}, "data": {"note": "keep me"}})
    yield "monitoring", name
    if made_namespace:
        lab.core.delete_namespace("monitoring")
    else:
        lab.core.delete_namespaced_config_map(name, "monitoring")


def snapshot(lab: Lab) -> Dict[str, object]:
    """What cluster.yml could touch: the roles' namespaces' objects and the cluster-scoped kinds it applies (name and
    resourceVersion), and the GPU nodes' labels (a node's resourceVersion moves with every heartbeat)."""
    from kubernetes.dynamic import DynamicClient

    dynamic = DynamicClient(lab.api_client)
    state: Dict[str, object] = {}
    for api_version, kind in CLUSTER_SCOPED:
        items = dynamic.resources.get(api_version=api_version, kind=kind).get().items
        # Other tests' namespaces (cluster.yml never touches them) may still be terminating while this test runs.
        state[kind] = sorted((item.metadata.name, item.metadata.resourceVersion) for item in items
                             if TEST_LABEL not in (item.metadata.labels.to_dict() if item.metadata.labels else {}))
    for namespace in ROLE_NAMESPACES:
        for api_version, kind in NAMESPACED:
            items = dynamic.resources.get(api_version=api_version, kind=kind).get(namespace=namespace).items
            state[f"{namespace}/{kind}"] = sorted((item.metadata.name, item.metadata.resourceVersion)
                                                  for item in items)
    state["node labels"] = {node.metadata.name: node.metadata.labels for node in lab.core.list_node().items}
    return state


def refused(lab: Lab, kubeconfig: Path) -> Tuple[str, float]:
    before = snapshot(lab)
    started = time.monotonic()
    rc, output = run_playbook(lab, "cluster.yml", "-e", f"gpu_cluster_kubeconfig={kubeconfig}")
    elapsed = time.monotonic() - started
    assert rc != 0, output[-3000:]
    # Refused by the access check of the first play, before any role's first task.
    assert "TASK [gpu_ops.cluster._common : Check that the kubeconfig can do what the run needs]" in output
    assert "PLAY [GPU stack in the cluster]" not in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert recap_changed(output) == 0
    assert snapshot(lab) == before
    return output, elapsed


def test_wrong_ca_is_refused_before_any_change(lab: Lab, bad_kubeconfigs: Dict[str, Path],
                                               user_config_map: Tuple[str, str]) -> None:
    output, elapsed = refused(lab, bad_kubeconfigs["wrong-ca"])
    assert (f"the server's certificate is not signed by the CA in {bad_kubeconfigs['wrong-ca']} (cluster gpu-lab, "
            "server https://") in output
    _user_config_map_kept(lab, user_config_map)
    print(f"wrong CA refused in {elapsed:.1f} s")


def test_expired_client_certificate_is_refused_before_any_change(lab: Lab, bad_kubeconfigs: Dict[str, Path],
                                                                  user_config_map: Tuple[str, str]) -> None:
    output, elapsed = refused(lab, bad_kubeconfigs["expired"])
    assert (f"the client certificate of user gpu-lab:expired in {bad_kubeconfigs['expired']} expired on "
            f"{bad_kubeconfigs['expired_on']}") in output
    _user_config_map_kept(lab, user_config_map)
    print(f"expired certificate refused in {elapsed:.1f} s")


def test_missing_rbac_is_refused_naming_each_verb_and_resource(lab: Lab, bad_kubeconfigs: Dict[str, Path],
                                                               user_config_map: Tuple[str, str]) -> None:
    output, elapsed = refused(lab, bad_kubeconfigs["read-only"])
    reader = bad_kubeconfigs["reader"]
    assert f"user {reader} of {bad_kubeconfigs['read-only']} lacks" in output
    # The SSARs' verdicts: writes missing, the reads the ClusterRole grants not listed.
    for missing in ("create namespaces (cluster-wide) (needed by nvidia_device_plugin, dcgm_exporter, prometheus, "
                    "tenancy)",
                    "patch nodes (cluster-wide) (needed by gpu_scheduling, nvidia_device_plugin, nvidia_dra_driver, "
                    "dcgm_exporter)",
                    "create node.k8s.io/runtimeclasses (cluster-wide) (needed by gpu_scheduling)",
                    "create apps/daemonsets in namespace nvidia-device-plugin (needed by nvidia_device_plugin)",
                    "patch apps/deployments in namespace monitoring (needed by prometheus, grafana)",
                    "create networking.k8s.io/networkpolicies (cluster-wide) (needed by tenancy)"):
        assert f"  - {missing}" in output, output[-4000:]
    assert not re.search(r"  - (get|list|watch) ", output), output[-4000:]
    assert " - delete " not in output  # the lab's teams are all present: no role deletes anything
    _user_config_map_kept(lab, user_config_map)
    print(f"missing RBAC refused in {elapsed:.1f} s")


def _user_config_map_kept(lab: Lab, user_config_map: Tuple[str, str]) -> None:
    namespace, name = user_config_map
    kept = lab.core.read_namespaced_config_map(name, namespace)
    assert kept.data == {"note": "keep me"}  # its resourceVersion is in the snapshot compared before and after
