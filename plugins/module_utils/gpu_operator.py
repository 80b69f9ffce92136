# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Who else runs GPU components in the cluster: NVIDIA's GPU Operator (its CRDs, its ClusterPolicy, its DaemonSets)
and any device plugin, GPU Feature Discovery or DCGM exporter this project did not deploy. Two of them on one node
advertise the same GPUs twice (two device plugins), label nodes from two configs (two GFDs) or double every series (two
exporters), so the cluster roles refuse before their first change unless the user chose: skip the component
(<role>_enabled: false) or deploy it anyway (<role>_take_over: true).

Pure functions over the objects as the API server returns them (module gpu_foreign_components does the requests).
What the GPU Operator names its objects comes from its own manifests (NVIDIA/gpu-operator, assets/state-*): the
DaemonSets carry an `app` label (nvidia-device-plugin-daemonset, gpu-feature-discovery, nvidia-dcgm-exporter,
nvidia-container-toolkit-daemonset, nvidia-driver-daemonset, ...) and run in the operator's namespace, whatever its
name; ClusterPolicy (clusterpolicies.nvidia.com, cluster-scoped) switches each component with spec.<component>.enabled.
"""

from __future__ import absolute_import, annotations, division, print_function

from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

DEVICE_PLUGIN = "device-plugin"
GFD = "gpu-feature-discovery"
DCGM_EXPORTER = "dcgm-exporter"
COMPONENTS = (DEVICE_PLUGIN, GFD, DCGM_EXPORTER)

# What a person reads in a message.
COMPONENT_NAMES = {DEVICE_PLUGIN: "NVIDIA device plugin", GFD: "GPU Feature Discovery", DCGM_EXPORTER: "DCGM exporter"}

# The GPU Operator's CRDs: either one means the operator is (or was: CRDs outlive a Helm uninstall, gpu-operator#1391)
# installed.
OPERATOR_CRDS = ("clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com")
CLUSTER_POLICY_CRD = "clusterpolicies.nvidia.com"
# ClusterPolicy's switch of each component (spec.<key>.enabled; the operator deploys the component unless false).
CLUSTER_POLICY_KEYS = {DEVICE_PLUGIN: "devicePlugin", GFD: "gfd", DCGM_EXPORTER: "dcgmExporter"}

# The `app` label of each GPU Operator DaemonSet, to its component (None: the operator's, not one a cluster role
# deploys; reported so a message can say that the operator runs there).
OPERATOR_APPS: Dict[str, Optional[str]] = {
    "nvidia-device-plugin-daemonset": DEVICE_PLUGIN,
    "nvidia-device-plugin-mps-control-daemon": DEVICE_PLUGIN,
    "gpu-feature-discovery": GFD,
    "nvidia-dcgm-exporter": DCGM_EXPORTER,
    "nvidia-container-toolkit-daemonset": None,
    "nvidia-driver-daemonset": None,
    "nvidia-dcgm": None,
    "nvidia-mig-manager": None,
    "nvidia-operator-validator": None,
}
# Names other installs (the upstream Helm charts and static manifests) give the same components, as the value of
# `app`, `app.kubernetes.io/name` or `name`.
COMPONENT_LABEL_VALUES = {
    "nvidia-device-plugin": DEVICE_PLUGIN,
    "nvidia-device-plugin-ds": DEVICE_PLUGIN,
    "k8s-device-plugin": DEVICE_PLUGIN,
    "gpu-feature-discovery": GFD,
    "dcgm-exporter": DCGM_EXPORTER,
}
NAME_LABELS = ("app", "app.kubernetes.io/name", "name")
# The last part of an image repository, to its component (nvcr.io/nvidia/k8s-device-plugin runs both the plugin and,
# from v0.15 on, GFD: the container's command tells them apart).
IMAGE_COMPONENTS = {"k8s-device-plugin": DEVICE_PLUGIN, "gpu-feature-discovery": GFD, "dcgm-exporter": DCGM_EXPORTER}

OWN_LABELS_DEFAULT = {"app.kubernetes.io/managed-by": "gpu-cluster"}


def is_own(obj: Mapping[str, Any], own_labels: Mapping[str, str]) -> bool:
    """Whether this project deployed the object: it carries every label of own_labels (the roles' management labels)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(own_labels) and all(labels.get(key) == value for key, value in own_labels.items())


def image_component(image: str) -> Optional[str]:
    """The component an image runs, from the last part of its repository (registry, tag and digest left out)."""
    repository = image.split("@", 1)[0]
    last = repository.rsplit("/", 1)[-1]
    return IMAGE_COMPONENTS.get(last.split(":", 1)[0])


def container_components(container: Mapping[str, Any]) -> List[str]:
    found = image_component(str(container.get("image") or ""))
    words = " ".join(str(part) for part in list(container.get("command") or []) + list(container.get("args") or []))
    if "config-manager" in words:
        return []  # the plugin's and GFD's config sidecar: it runs neither
    if GFD in words or GFD in str(container.get("name") or ""):
        return [GFD]
    return [found] if found else []


def daemonset_components(daemonset: Mapping[str, Any]) -> List[str]:
    """The components a DaemonSet runs, from its labels (the operator's `app`, the charts' names) and its containers'
    images (init containers left out: the operator's device plugin runs its config-manager as one)."""
    labels = (daemonset.get("metadata") or {}).get("labels") or {}
    template = (daemonset.get("spec") or {}).get("template") or {}
    template_labels = (template.get("metadata") or {}).get("labels") or {}
    found: List[str] = []
    for source in (labels, template_labels):
        for key in NAME_LABELS:
            value = source.get(key)
            component = OPERATOR_APPS.get(value) if value in OPERATOR_APPS else COMPONENT_LABEL_VALUES.get(value)
            if component and component not in found:
                found.append(component)
    for container in (template.get("spec") or {}).get("containers") or []:
        for component in container_components(container):
            if component not in found:
                found.append(component)
    return found


def operator_app(daemonset: Mapping[str, Any]) -> Optional[str]:
    """The GPU Operator's `app` label of a DaemonSet, when it is one of the operator's."""
    value = ((daemonset.get("metadata") or {}).get("labels") or {}).get("app")
    return value if value in OPERATOR_APPS else None


def policy_enables(policy: Mapping[str, Any], component: str) -> bool:
    """Whether a ClusterPolicy has the operator deploy the component (its default: yes, unless enabled is false)."""
    section = (policy.get("spec") or {}).get(CLUSTER_POLICY_KEYS[component]) or {}
    return section.get("enabled", True) is not False


def _where(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return "%s/%s" % (meta["namespace"], meta.get("name", "")) if meta.get("namespace") else str(meta.get("name", ""))


def find(components: Sequence[str], crds: Iterable[str], cluster_policies: Sequence[Mapping[str, Any]],
         daemonsets: Sequence[Mapping[str, Any]], own_labels: Mapping[str, str]) -> List[Dict[str, str]]:
    """What another owner runs of the given components, each {kind, namespace, name, component, owner, why}:
    - every DaemonSet, in any namespace, that runs one of them and does not carry own_labels;
    - every ClusterPolicy that does not switch one of them off (the operator deploys it, now or once its nodes come);
    - the GPU Operator's CRDs when no ClusterPolicy exists (an operator waiting for one, or its leftovers).
    A ClusterPolicy that switches all of them off is no finding: that is how one runs this project's component
    beside the operator."""
    found: List[Dict[str, str]] = []
    for daemonset in daemonsets:
        if is_own(daemonset, own_labels):
            continue
        app = operator_app(daemonset)
        for component in daemonset_components(daemonset):
            if component in components:
                meta = daemonset.get("metadata") or {}
                own = ", ".join("%s=%s" % item for item in sorted(own_labels.items()))
                why = ("the GPU Operator's, label app=%s" % app if app else
                       "a %s this project did not deploy, no label %s" % (COMPONENT_NAMES[component], own))
                found.append({
                    "kind": "DaemonSet", "namespace": meta.get("namespace", ""), "name": meta.get("name", ""),
                    "component": component, "owner": "GPU Operator" if app else "unknown", "why": why})
    for policy in cluster_policies:
        enabled = [component for component in components if policy_enables(policy, component)]
        for component in enabled:
            found.append({
                "kind": "ClusterPolicy", "namespace": "", "name": (policy.get("metadata") or {}).get("name", ""),
                "component": component, "owner": "GPU Operator",
                "why": "the GPU Operator deploys its %s (spec.%s.enabled is not false)" % (
                    COMPONENT_NAMES[component], CLUSTER_POLICY_KEYS[component])})
    if not cluster_policies:
        for crd in sorted(set(crds) & set(OPERATOR_CRDS)):
            found.append({
                "kind": "CustomResourceDefinition", "namespace": "", "name": crd, "component": ", ".join(components),
                "owner": "GPU Operator",
                "why": "the GPU Operator is or was installed, its CRDs outlive an uninstall; a ClusterPolicy created "
                       "later deploys its own components"})
    return found


def objects(found: Sequence[Mapping[str, str]]) -> List[str]:
    """Each object found once, as `Kind namespace/name` (`Kind name` when cluster-scoped), in the order found."""
    names: List[str] = []
    for item in found:
        name = "%s %s" % (item["kind"], "%s/%s" % (item["namespace"], item["name"]) if item.get("namespace")
                          else item["name"])
        if name not in names:
            names.append(name)
    return names


def describe(item: Mapping[str, str]) -> str:
    where = "%s/%s" % (item["namespace"], item["name"]) if item.get("namespace") else item["name"]
    return "%s %s (%s)" % (item["kind"], where, item["why"])


def refusal(found: Sequence[Mapping[str, str]], components: Sequence[str], skip_setting: str,
            take_over_setting: str) -> str:
    """One message naming everything found and the two ways on: skip the component, or take over."""
    if not found:
        return ""
    what = " or ".join(COMPONENT_NAMES[component] for component in components)
    lines = "; ".join(describe(item) for item in found)
    message = ("another %s, or the GPU Operator, already runs in this cluster: %s. Nothing was changed. Choose one: "
               "leave it to that owner with %s=false (this role then changes nothing), or deploy this project's "
               "anyway with %s=true after switching the other one off"
               % (what, lines, skip_setting, take_over_setting))
    if any(item["kind"] == "ClusterPolicy" for item in found):
        keys = sorted({CLUSTER_POLICY_KEYS[component] for component in components})
        message += " (in the GPU Operator: %s in the ClusterPolicy)" % ", ".join(
            "spec.%s.enabled=false" % key for key in keys)
    elif any(item["kind"] == "CustomResourceDefinition" for item in found):
        message += (" (a GPU Operator that is no longer used: delete its CRDs %s; one still in use: create its "
                    "ClusterPolicy with %s)" % (", ".join(OPERATOR_CRDS), ", ".join(
                        "spec.%s.enabled=false" % CLUSTER_POLICY_KEYS[component] for component in components)))
    return message + "."


def served_version(crd: Mapping[str, Any]) -> Optional[str]:
    """The version to read a CRD's objects in: its storage version, else the first served one."""
    versions = (crd.get("spec") or {}).get("versions") or []
    for version in versions:
        if version.get("storage") and version.get("served", True):
            return version.get("name")
    served = [version.get("name") for version in versions if version.get("served", True)]
    return served[0] if served else None
