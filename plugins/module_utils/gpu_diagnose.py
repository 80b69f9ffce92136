# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""What the diagnose playbook does with what it collected: secrets redacted, known failure signatures matched to
their causes and fixes, the cluster's GPU picture drawn, and a summary a person reads. Pure functions (no I/O), used by
plugins/modules/gpu_diagnose_report.py and unit-tested with real messages (tests/unit/test_gpu_diagnose.py).

Each signature is a message that a real component prints when a known thing is wrong; the wording of each pattern
comes from recorded messages in the upstream projects' issue threads (named beside each signature).
"""

from __future__ import absolute_import, annotations, division, print_function

import datetime
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from ansible_collections.gpu_ops.cluster.plugins.module_utils import support_matrix

REDACTED = "<redacted>"
EVIDENCE_LIMIT = 5
LINE_LIMIT = 400


@dataclass(frozen=True)
class Signature:
    id: str
    title: str
    pattern: "re.Pattern[str]"
    cause: str
    fix: str


SIGNATURES: Sequence[Signature] = (
    # kubelet event FailedCreatePodSandBox (NVIDIA/gpu-operator#413, #730): "Failed to create pod sandbox: rpc error:
    # code = Unknown desc = failed to get sandbox runtime: no runtime for "nvidia" is configured"
    Signature(
        "runtime_not_configured", "The container runtime has no runtime for the RuntimeClass's handler",
        re.compile(r"no runtime for [\"'\u201c\u201d]?([\w.-]+)[\"'\u201c\u201d]? is configured", re.IGNORECASE),
        "A pod asked for a RuntimeClass whose handler (e.g. nvidia) is not a runtime in containerd's config on that "
        "node: the container toolkit's drop-in is missing, not imported, or containerd was not restarted after it.",
        "Run the nvidia_container_toolkit role on the node (or check `containerd config dump` for "
        "plugins...containerd.runtimes.nvidia), restart containerd, and make the RuntimeClass handler match the "
        "runtime's name."),
    # nvidia-smi / NVML after a driver upgrade without a reboot (deepops#1186; recorded in
    # tests/unit/fixtures/nvidia_smi/error-version-mismatch.txt): "Failed to initialize NVML: Driver/library version
    # mismatch"
    Signature(
        "driver_library_mismatch", "Driver/library version mismatch",
        re.compile(r"Driver/library version mismatch", re.IGNORECASE),
        "The NVIDIA userspace libraries (NVML) were upgraded but the old kernel module is still loaded: every CUDA and "
        "NVML call on the node fails until the module matches.",
        "Drain the node and reboot it (or unload and reload the nvidia kernel modules); playbooks/upgrade.yml does "
        "this node by node. Hold the driver packages so unattended upgrades cannot do it again."),
    # kube-scheduler's FailedScheduling (kubernetes): "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    Signature(
        "insufficient_gpu", "Not enough GPUs free for a pod (scheduler: Insufficient nvidia.com/...)",
        re.compile(r"Insufficient (nvidia\.com/[\w./-]+)"),
        "The scheduler found no node with enough free GPU resources for the pod: all are allocated, the nodes do "
        "not advertise them (device plugin down, wrong resource name, sharing renamed to nvidia.com/gpu.shared), or "
        "the pod's affinity, selectors or tolerations leave only nodes without free GPUs.",
        "Compare the nodes' allocatable GPUs in this report with the pods' requests; check the device plugin pods, "
        "the resource name the pod asks for, and its node selectors; add GPU nodes or lower the request."),
    # kubelet event Failed (NVIDIA/nvidia-container-toolkit#1239, kubernetes-sigs/dra-driver-nvidia-gpu#736):
    # "Error: failed to create containerd container: CDI device injection failed: unresolvable CDI devices ..."
    Signature(
        "cdi_unresolvable", "Unresolvable CDI devices",
        re.compile(r"unresolvable CDI devices?\s*([^\s,]*)", re.IGNORECASE),
        "The runtime was asked to inject a CDI device (such as nvidia.com/gpu=all or a GPU UUID) that no CDI spec in "
        "/etc/cdi or /var/run/cdi defines: the spec is missing, stale after a driver or GPU change, or names the "
        "devices differently.",
        "Regenerate the CDI spec on the node (`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`, or run the "
        "nvidia_container_toolkit role) and compare its device names with the ones asked for (see the cdi/ files in "
        "this archive)."),
    # NVIDIA/k8s-device-plugin#444, #478, #23: "Failed to initialize NVML: could not load NVML library." and
    # "NVML not detected: could not load NVML library: libnvidia-ml.so.1: cannot open shared object file"
    Signature(
        "nvml_not_loaded", "NVML could not be loaded (device plugin or exporter sees no driver)",
        re.compile(r"could not load NVML library|Failed to initialize NVML(?!: Driver/library version mismatch)|"
                   r"libnvidia-ml\.so(\.1)?: cannot open shared object file", re.IGNORECASE),
        "A GPU component (usually the device plugin) started without the NVIDIA libraries in its container: nvidia "
        "is not containerd's default runtime and the pod has no nvidia RuntimeClass, or the driver is not installed "
        "or loaded on the node.",
        "Make nvidia the default runtime (nvidia_container_toolkit_default_for) or give the device plugin the "
        "nvidia RuntimeClass; check nvidia-smi on the node (this archive's nodes/<node>/nvidia-smi.txt)."),
    # PodSecurity admission (kubernetes): 'pods "x" is forbidden: violates PodSecurity "restricted:latest": ...'
    Signature(
        "pod_security", "Pod Security admission refused a pod",
        re.compile(r"violates PodSecurity \"([^\"]+)\""),
        "The namespace enforces a Pod Security level (restricted, as the tenancy role sets for team namespaces) and "
        "the pod asks for more (privileged, host paths, no seccomp profile, running as root, ...).",
        "Give the pod the restricted profile's securityContext (runAsNonRoot, allowPrivilegeEscalation: false, "
        "capabilities drop ALL, seccompProfile RuntimeDefault; the training_workloads role's Jobs do), or run it in a "
        "namespace meant for privileged system components."),
    # ResourceQuota admission (kubernetes): 'pods "x" is forbidden: exceeded quota: gpu, requested:
    # requests.nvidia.com/gpu=2, used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=1'
    Signature(
        "quota_exceeded", "A ResourceQuota is exhausted",
        re.compile(r"exceeded quota: ([\w.-]+)"),
        "The namespace's ResourceQuota (the tenancy role's GPU quota, for example) has no room for the pod's "
        "requests: the pods are refused at admission and their Job or Deployment keeps retrying.",
        "See the quota use in this report (cluster/resourcequotas.json); wait for the team's other GPU pods to "
        "finish, lower the request, or raise the team's quota in the inventory (tenancy_teams[].gpus)."),
)

# --- Redaction --------------------------------------------------------------------------------------------------------

# A key whose value is a secret: password, token, secret, credentials, API or private keys, auth headers. Whole keys
# such as `key` (a taint's, a label's) are not secrets and stay.
_SECRET_KEY = re.compile(
    r"(pass(word|wd|phrase)?|secret|token|credentials?|api[_-]?key|access[_-]?key|private[_-]?key|client[_-]?key"
    r"|auth(orization)?|cookie|session[_-]?key)$|^(pass(word|wd)?|secret|token|auth)", re.IGNORECASE)
# key = value, key: value, "key": "value", KEY=value in text (configs, logs, env dumps).
_TEXT_PAIR = re.compile(
    r"(?P<key>[\"']?(?P<name>[A-Za-z0-9_.-]*(?:password|passwd|passphrase|secret|token|credential|api[_-]?key"
    r"|access[_-]?key|private[_-]?key|client[_-]?key|auth)[A-Za-z0-9_.-]*)[\"']?)"
    r"(?P<sep>[ \t]*[:=][ \t]*)(?P<value>\"[^\"\n]*\"|'[^'\n]*'|[^\s,;}\]]+)", re.IGNORECASE)
_PEM = re.compile(r"-----BEGIN ([A-Z ]*PRIVATE KEY)-----.*?-----END \1-----", re.DOTALL)
_BEARER = re.compile(r"\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{8,}")
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}")
_URL_CREDENTIALS = re.compile(r"(://[^/\s:@]+):[^/\s@]+@")
# Keys whose values are names or numbers about secrets, not secrets.
_NOT_SECRET_NAMES = re.compile(r"(secretName|secretRef|tokenExpirationSeconds|authorization-mode|auth[_-]?mode"
                               r"|automountServiceAccountToken|secret_name|token_path|token_file|tokenfile)$", re.IGNORECASE)


def _redact_pair(match: "re.Match[str]") -> str:
    value = match.group("value")
    if value in ('""', "''") or _NOT_SECRET_NAMES.search(match.group("name")) or value.startswith(REDACTED):
        return match.group(0)
    quote = value[0] if value[0] in "\"'" else ""
    return match.group("key") + match.group("sep") + quote + REDACTED + quote


def redact_text(text: Optional[str]) -> str:
    """The text with every secret-looking value replaced by <redacted>: private keys, bearer tokens, JWTs, passwords
    in URLs, and the values of keys that name a password, token, secret, credential or API/private key."""
    if not text:
        return text or ""
    text = _PEM.sub(lambda m: "-----BEGIN %s-----\n%s\n-----END %s-----" % (m.group(1), REDACTED, m.group(1)), text)
    text = _BEARER.sub(lambda m: "%s %s" % (m.group(1), REDACTED), text)
    text = _JWT.sub(REDACTED, text)
    text = _URL_CREDENTIALS.sub(r"\1:%s@" % REDACTED, text)
    return _TEXT_PAIR.sub(_redact_pair, text)


def _secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key)) and not _NOT_SECRET_NAMES.search(key)


def redact_data(data: Any) -> Any:
    """A copy of structured data (API objects, facts) with secrets redacted: the string value of a secret-named key,
    an env entry {name: SOME_TOKEN, value: ...}, a Secret's data, and secrets inside every other string."""
    if isinstance(data, Mapping):
        if data.get("kind") == "Secret":
            return {key: ({k: REDACTED for k in value} if key in ("data", "stringData") and isinstance(value, Mapping)
                          else redact_data(value)) for key, value in data.items()}
        env_secret = isinstance(data.get("name"), str) and _secret_key(data["name"]) and "value" in data
        copy: Dict[str, Any] = {}
        for key, value in data.items():
            if isinstance(value, str) and value and ((env_secret and key == "value") or _secret_key(str(key))):
                copy[key] = REDACTED
            else:
                copy[key] = redact_data(value)
        return copy
    if isinstance(data, (list, tuple)):
        return [redact_data(item) for item in data]
    if isinstance(data, str):
        return redact_text(data)
    return data


# --- Signatures ---------------------------------------------------------------------------------------------------------


def match_signatures(sources: Iterable[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Findings, in SIGNATURES order, for sources [{source: where the text came from, text}]: each matched signature
    with its cause, fix, what it names (runtime handler, resource, Pod Security level, quota), the sources that showed
    it and up to EVIDENCE_LIMIT distinct lines."""
    hits: Dict[str, Dict[str, Any]] = {}
    for entry in sources:
        source = str(entry.get("source") or "")
        for line in str(entry.get("text") or "").splitlines():
            for signature in SIGNATURES:
                match = signature.pattern.search(line)
                if not match:
                    continue
                hit = hits.setdefault(signature.id, {"lines": [], "sources": [], "names": [], "count": 0})
                hit["count"] += 1
                if source not in hit["sources"]:
                    hit["sources"].append(source)
                named = next((group for group in match.groups() if group), None) if match.groups() else None
                if named and named.rstrip(".") not in hit["names"]:
                    hit["names"].append(named.rstrip("."))
                evidence = {"source": source, "line": line.strip()[:LINE_LIMIT]}
                if len(hit["lines"]) < EVIDENCE_LIMIT and evidence["line"] not in [e["line"] for e in hit["lines"]]:
                    hit["lines"].append(evidence)
    return [{"id": signature.id, "title": signature.title, "cause": signature.cause, "fix": signature.fix,
             "names": hits[signature.id]["names"], "count": hits[signature.id]["count"],
             "sources": hits[signature.id]["sources"], "evidence": hits[signature.id]["lines"]}
            for signature in SIGNATURES if signature.id in hits]


# --- The cluster's GPU picture -----------------------------------------------------------------------------------------

GPU_RESOURCE = re.compile(r"^(nvidia\.com/|[\w.-]*gpu)")


def _selector_matches(labels: Mapping[str, str], selector: str) -> bool:
    for term in filter(None, (part.strip() for part in (selector or "").split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.strip().rstrip("=")) != value.strip().lstrip("="):
                return False
        elif term.strip() not in labels:
            return False
    return True


def gpu_resources(resources: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    return {name: value for name, value in (resources or {}).items() if name.startswith("nvidia.com/")}


def is_gpu_node(node: Mapping[str, Any], selector: str, inventory_nodes: Sequence[str] = ()) -> bool:
    metadata = node.get("metadata") or {}
    status = node.get("status") or {}
    return (metadata.get("name") in inventory_nodes or bool(gpu_resources(status.get("capacity")))
            or bool(selector) and _selector_matches(metadata.get("labels") or {}, selector))


def pod_gpu_requests(pod: Mapping[str, Any]) -> Dict[str, Any]:
    requested: Dict[str, Any] = {}
    spec = pod.get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            requested.update(gpu_resources(resources.get(section)))
    return requested


def _name(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    return "%s/%s" % (metadata["namespace"], metadata.get("name")) if metadata.get("namespace") else str(metadata.get("name"))


def _container_states(pod: Mapping[str, Any]) -> List[Dict[str, Any]]:
    states = []
    status = pod.get("status") or {}
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        state = container.get("state") or {}
        last = (container.get("lastState") or {}).get("terminated") or {}
        current = next(iter(state), None)
        states.append({"name": container.get("name"), "ready": bool(container.get("ready")),
                       "restarts": container.get("restartCount", 0), "state": current,
                       "reason": (state.get(current) or {}).get("reason") if current else None,
                       "message": (state.get(current) or {}).get("message") if current else None,
                       "last_terminated_reason": last.get("reason"), "last_terminated_message": last.get("message")})
    return states


def pod_summary(pod: Mapping[str, Any]) -> Dict[str, Any]:
    status = pod.get("status") or {}
    return {"pod": _name(pod), "node": (pod.get("spec") or {}).get("nodeName"), "phase": status.get("phase"),
            "conditions": [{key: condition.get(key) for key in ("type", "status", "reason", "message")}
                           for condition in status.get("conditions") or [] if condition.get("status") != "True"],
            "containers": _container_states(pod), "gpu_requests": pod_gpu_requests(pod)}


def cluster_view(cluster: Mapping[str, Any], gpu_node_selector: str, inventory_nodes: Sequence[str] = ()) -> Dict[str, Any]:
    """What a person asks first about the GPUs in the cluster, from the raw LISTs the role read: the GPU nodes'
    capacity, allocatable, conditions and taints; the device plugin's and exporter's pods; Pending GPU pods with the
    scheduler's reasons; the GPU quotas' use; the Warning events."""
    nodes = [node for node in cluster.get("nodes") or [] if is_gpu_node(node, gpu_node_selector, inventory_nodes)]
    pending = [pod for pod in cluster.get("pending_pods") or [] if pod_gpu_requests(pod)]
    quotas = []
    for quota in cluster.get("resource_quotas") or []:
        status = quota.get("status") or {}
        hard = {key: value for key, value in (status.get("hard") or {}).items() if "nvidia.com/" in key}
        if hard:
            used = {key: value for key, value in (status.get("used") or {}).items() if key in hard}
            quotas.append({"quota": _name(quota), "hard": hard, "used": used,
                           "exhausted": sorted(key for key in hard if str(used.get(key)) == str(hard[key])
                                               and str(hard[key]) not in ("0",))})
    return {
        "gpu_nodes": [{
            "name": (node.get("metadata") or {}).get("name"),
            "capacity": gpu_resources((node.get("status") or {}).get("capacity")),
            "allocatable": gpu_resources((node.get("status") or {}).get("allocatable")),
            "unschedulable": bool((node.get("spec") or {}).get("unschedulable")),
            "taints": (node.get("spec") or {}).get("taints") or [],
            "conditions": [{key: condition.get(key) for key in ("type", "status", "reason", "message")}
                           for condition in (node.get("status") or {}).get("conditions") or []],
        } for node in nodes],
        "device_plugin_pods": [pod_summary(pod) for pod in cluster.get("device_plugin_pods") or []],
        "dcgm_exporter_pods": [pod_summary(pod) for pod in cluster.get("dcgm_exporter_pods") or []],
        "pending_gpu_pods": [pod_summary(pod) for pod in pending],
        "gpu_quotas": quotas,
        "runtime_classes": [{"name": (rc.get("metadata") or {}).get("name"), "handler": rc.get("handler")}
                            for rc in cluster.get("runtime_classes") or []],
        "warning_events": [{"object": "%s %s" % ((event.get("involvedObject") or {}).get("kind"),
                                                 _name({"metadata": {**(event.get("involvedObject") or {})}})),
                            "reason": event.get("reason"), "count": event.get("count"),
                            "source": (event.get("source") or {}).get("component") or event.get("reportingComponent"),
                            "message": event.get("message")}
                           for event in cluster.get("events") or []],
    }


def cluster_sources(view: Mapping[str, Any], logs: Optional[Mapping[str, str]] = None) -> List[Dict[str, str]]:
    """The texts of the cluster view that signatures are matched in: events, pods' conditions and container states,
    and the pods' logs."""
    sources = [{"source": "event %s (%s, %s)" % (event["object"], event.get("source"), event.get("reason")),
                "text": event.get("message") or ""} for event in view.get("warning_events") or []]
    for group in ("pending_gpu_pods", "device_plugin_pods", "dcgm_exporter_pods"):
        for pod in view.get(group) or []:
            lines = [str(c.get("message") or "") for c in pod["conditions"]]
            for container in pod["containers"]:
                lines += [str(container.get("message") or ""), str(container.get("last_terminated_message") or "")]
            sources.append({"source": "pod %s" % pod["pod"], "text": "\n".join(line for line in lines if line)})
    for name, text in sorted((logs or {}).items()):
        sources.append({"source": "log %s" % name, "text": text or ""})
    return sources


def node_observations(name: str, facts: Mapping[str, Any], today: Optional[datetime.date] = None) -> List[str]:
    """What the facts module found wrong on a node that is not a failure signature: its problems and Xid reports,
    and (judged on today) a running driver whose branch is past its end of life (support_matrix's line, the same as
    the validation report's)."""
    if not facts:
        return ["%s: not collected (unreachable or failed before the GPU facts)" % name]
    notes = ["%s: %s" % (name, problem) for problem in facts.get("problems") or []]
    if facts.get("error_kind") and not facts.get("problems"):
        notes.append("%s: %s: %s" % (name, facts["error_kind"], " ".join(str(facts.get("error") or "").split())))
    eol = support_matrix.node_driver_eol_warning(name, facts.get("driver_version"), today) if today else ""
    return notes + ([eol] if eol else [])


def summary_text(report: Mapping[str, Any]) -> str:
    findings = report.get("findings") or []
    lines = ["GPU diagnose: %d GPU node(s) collected, %d GPU node(s) in the cluster, %d Pending GPU pod(s); %s" % (
        len(report.get("nodes_collected") or []), len((report.get("cluster") or {}).get("gpu_nodes") or []),
        len((report.get("cluster") or {}).get("pending_gpu_pods") or []),
        "%d known failure signature(s) found" % len(findings) if findings else "no known failure signature found")]
    for finding in findings:
        named = " (%s)" % ", ".join(finding["names"]) if finding.get("names") else ""
        sources = "; ".join(finding["sources"][:4])
        if len(finding["sources"]) > 4:
            sources += " and %d more" % (len(finding["sources"]) - 4)
        lines.append("[%s] %s%s: seen %d time(s) in %s"
                     % (finding["id"], finding["title"], named, finding["count"], sources))
        lines.append("  cause: %s" % finding["cause"])
        lines.append("  fix: %s" % finding["fix"])
        for evidence in finding["evidence"][:2]:
            lines.append("  e.g. %s: %s" % (evidence["source"], evidence["line"][:200]))
    for note in report.get("observations") or []:
        lines.append("note: %s" % note)
    if report.get("archive"):
        lines.append("archive: %s" % report["archive"])
    return "\n".join(lines) + "\n"
