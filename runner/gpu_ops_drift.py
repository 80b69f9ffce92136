#!/usr/bin/env python
"""Drift correction: detect, report, measure and (where the inventory's policy says so) repair what drifted.

``check`` runs ``gpu_ops.cluster.drift`` (the node and cluster parts of site.yml) through ansible-runner in check and
diff mode, turns the run's events into drift items (host, role, drift class, task, resource, redacted diff), lists
the tasks check mode cannot verify and the hosts it could not reach, and decides per item from the policy in the
inventory (``gpu_drift_policy``: per class ``report``, ``repair`` or ``approve``; ``gpu_drift_opt_out``: hosts or
objects left alone until a date; an object may opt itself out with the annotation ``gpu-ops.dev/drift-opt-out-until``).
``repair`` items are repaired by a real run of the same playbook limited to their classes' tags and hosts, node hosts
in batches with a failure budget, then checked again. ``approve`` items go to a plan that ``apply PLAN`` carries out
after checking again that the drift is still the one approved. Nothing is deleted: the roles never delete what is not
declared, and the run changes only what the roles would.

Each run writes ``<reports>/<ident>/drift.json`` (schema in docs/drift-report.schema.json), ``drift.txt`` (the
readable summary), ``plan.json`` when something awaits approval, and the runner's artifacts; ``<reports>/latest.json``
is the last report, and the metrics file (node_exporter's textfile format) is replaced atomically.

Exit codes, for a scheduler: 0 in sync; 2 drift found (reported, awaiting approval, held or unverified because a host
was unreachable); 3 drift found and all of it repaired (the re-check is clean); 1 the run failed (bad input, a failed
task, a repair the re-check does not confirm); 4 another drift run holds the lock (this one did nothing).

Pure functions (classification, redaction, policy, decisions, report, metrics) are tested without Ansible.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, TextIO, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_ops_run  # noqa: E402  (the one runner entry point: runs, artifacts, summary.json)

SCHEMA = 1
PLAN_SCHEMA = 1
PLAYBOOK = "gpu_ops.cluster.drift"
EXIT_IN_SYNC, EXIT_FAILED, EXIT_DRIFT, EXIT_REPAIRED, EXIT_LOCKED = 0, 1, 2, 3, 4
ACTIONS = ("report", "repair", "approve")
CHANGED_EVENTS = ("runner_on_ok",)
REDACTED = "<redacted>"
HIDDEN = "<hidden: no_log>"
SECRET_KEY = re.compile(r"(password|passwd|secret|token|credential|private[_-]?key)", re.IGNORECASE)
MAX_TEXT = 4000
# An object opts itself out of drift correction until a date (inclusive), with an optional reason:
#   kubectl annotate configmap/x gpu-ops.dev/drift-opt-out-until=2026-12-31 gpu-ops.dev/drift-opt-out-reason="..."
OPT_OUT_UNTIL = "gpu-ops.dev/drift-opt-out-until"
OPT_OUT_REASON = "gpu-ops.dev/drift-opt-out-reason"
OPT_OUT_ANNOTATIONS = (OPT_OUT_UNTIL, OPT_OUT_REASON)

# Drift classes: what the policy names. Each comes from one role (the tenancy role's objects split by kind), and a
# repair runs that role by its tag. `scope` node: a host of gpu_nodes; cluster: objects through the control host;
# fleet: objects through the control host, decided from what the role read on the GPU nodes (the repair reads them
# again: DriftItem.reads).
CLASSES: Dict[str, Dict[str, Any]] = {
    "driver": {"role": "nvidia_driver", "scope": "node",
               "what": "driver packages, their holds, repository, nouveau blacklist, persistence daemon"},
    "cuda": {"role": "cuda_toolkit", "scope": "node", "what": "CUDA toolkit packages, default version, PATH and ld config"},
    "container_runtime": {"role": "nvidia_container_toolkit", "scope": "node",
                          "what": "container toolkit packages, the containerd/Docker/CRI-O runtime entry, CDI spec"},
    "scheduling": {"role": "gpu_scheduling", "scope": "cluster", "what": "GPU node labels, the nvidia RuntimeClass"},
    "device_plugin": {"role": "nvidia_device_plugin", "scope": "cluster",
                      "what": "device plugin DaemonSet, RBAC, sharing configs, the nodes' config labels"},
    "monitoring": {"role": ("dcgm_exporter", "prometheus", "grafana"), "scope": "cluster",
                   "what": "DCGM exporter, Prometheus (configuration, alert rules), Grafana"},
    "tenancy_namespace": {"role": "tenancy", "scope": "cluster",
                          "what": "team namespaces and their Pod Security labels, the node pool admission policy"},
    "tenancy_rbac": {"role": "tenancy", "scope": "cluster", "what": "team Roles and RoleBindings"},
    "quota": {"role": "tenancy", "scope": "cluster", "what": "team ResourceQuotas and LimitRanges"},
    "network_policy": {"role": "tenancy", "scope": "cluster", "what": "team NetworkPolicies"},
    "workloads": {"role": "training_workloads", "scope": "cluster", "what": "the example training Jobs and scripts"},
    "gpu_health": {"role": "gpu_health", "scope": "fleet",
                   "what": "the GPU health quarantine: the taint and annotation of GPU nodes failing or passing again"},
    "other": {"role": (), "scope": "any", "what": "a change outside the roles above (never repaired)"},
}
TENANCY_KINDS = {"Role": "tenancy_rbac", "RoleBinding": "tenancy_rbac", "ResourceQuota": "quota",
                 "LimitRange": "quota", "NetworkPolicy": "network_policy"}
REPAIRABLE = tuple(name for name in CLASSES if name != "other")


class DriftInputError(ValueError):
    """Bad drift settings in the inventory or on the command line: nothing has run."""


# --- roles and classes ------------------------------------------------------------------------------------------------

def role_name(role: Optional[str]) -> str:
    """gpu_ops.cluster.nvidia_driver -> nvidia_driver; '' for a task outside a role."""
    return (role or "").rsplit(".", 1)[-1]


def class_of(role: str, kind: Optional[str] = None) -> str:
    """The drift class of a change made by `role` (to an object of `kind`, for the tenancy role)."""
    if role == "tenancy":
        return TENANCY_KINDS.get(kind or "", "tenancy_namespace")
    for name, spec in CLASSES.items():
        roles = spec["role"] if isinstance(spec["role"], tuple) else (spec["role"],)
        if role in roles:
            return name
    return "other"


def class_tags(classes: Iterable[str]) -> List[str]:
    """The tags that run these classes' roles (each role is tagged with its name in the playbooks)."""
    tags = set()
    for name in classes:
        spec = CLASSES[name]["role"]
        tags.update(spec if isinstance(spec, tuple) else (spec,))
    return sorted(tags)


def classes_of_tags(tags: Iterable[str]) -> List[str]:
    """Every class a run with these tags touches (a tenancy repair touches all four tenancy classes)."""
    wanted = set(tags)
    return [name for name in REPAIRABLE if set(class_tags([name])) & wanted]


# --- redaction and diffs ------------------------------------------------------------------------------------------

def redact(value: Any, kind: Optional[str] = None) -> Any:
    """A copy with secrets replaced: a Secret's data and stringData values, and any key that names a secret."""
    if isinstance(value, dict):
        out = {}
        object_kind = value.get("kind") if isinstance(value.get("kind"), str) else kind
        for key, item in value.items():
            if isinstance(key, str) and SECRET_KEY.search(key) and not isinstance(item, (dict, list)):
                out[key] = REDACTED
            elif object_kind == "Secret" and key in ("data", "stringData") and isinstance(item, dict):
                out[key] = {name: REDACTED for name in item}
            else:
                out[key] = redact(item, object_kind)
        return out
    if isinstance(value, list):
        return [redact(item, kind) for item in value]
    return value


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"... ({len(text) - MAX_TEXT} more characters)"


def changed_paths(before: Any, after: Any, prefix: str = "") -> List[Dict[str, Any]]:
    """The leaves that differ between two JSON values, as {path, before, after}; lists compared whole."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: List[Dict[str, Any]] = []
        for key in sorted(set(before) | set(after), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in after:
                out.append({"path": path, "before": before[key], "after": None})
            elif key not in before:
                out.append({"path": path, "before": None, "after": after[key]})
            else:
                out.extend(changed_paths(before[key], after[key], path))
        return out
    if before == after:
        return []
    return [{"path": prefix or ".", "before": before, "after": after}]


# Fields the API server or kubectl keep for themselves: a difference there is bookkeeping, not drift.
SERVER_FIELDS = ("metadata.managedFields", "metadata.resourceVersion", "metadata.generation", "metadata.uid",
                 "metadata.creationTimestamp", "metadata.annotations.kubectl.kubernetes.io/last-applied-configuration",
                 "status")


def without_server_fields(obj: Any) -> Any:
    """An object without the fields in SERVER_FIELDS (and without maps those leave empty)."""
    if not isinstance(obj, dict):
        return obj
    out = copy.deepcopy(obj)
    for field_path in SERVER_FIELDS:
        parent, key = out, field_path
        # Annotation keys hold dots: walk metadata.annotations, then take the rest as one key.
        parts = field_path.split(".", 2) if field_path.startswith("metadata.annotations.") else field_path.split(".")
        for part in parts[:-1]:
            parent = parent.get(part) if isinstance(parent, dict) else None
        key = parts[-1]
        if isinstance(parent, dict):
            parent.pop(key, None)
    meta = out.get("metadata")
    if isinstance(meta, dict) and meta.get("annotations") == {}:
        meta.pop("annotations")
    return out


def diff_of(result: Mapping[str, Any], kind: Optional[str] = None) -> Any:
    """What the task would change, redacted: field changes for objects (without the server's bookkeeping),
    before/after text for files, a module's own before/after values (a package's selection), or the module's diff
    (apt's prepared list) as it is."""
    diffs = result.get("diff")
    if diffs is None:
        before, after = result.get("before"), result.get("after")
        if isinstance(before, (str, int, float)) and isinstance(after, (str, int, float)) and before != after:
            return [{"path": resource_of(result) or ".", "before": before, "after": after}]
        return None
    entries = diffs if isinstance(diffs, list) else [diffs]
    out: List[Any] = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        before, after = entry.get("before"), entry.get("after")
        if isinstance(before, dict) or isinstance(after, dict):
            out.extend(redact(changed_paths(without_server_fields(redact(before or {}, kind)),
                                            without_server_fields(redact(after or {}, kind)))))
        elif (isinstance(before, str) or isinstance(after, str)) and before != after:
            out.append({"path": entry.get("after_header") or entry.get("before_header") or ".",
                        "before": _truncate(before or ""), "after": _truncate(after or "")})
        elif entry.get("prepared"):
            out.append({"prepared": _truncate(str(entry["prepared"]))})
    return out or None


# --- events -> items ----------------------------------------------------------------------------------------------

@dataclass
class DriftItem:
    host: str
    role: str
    drift_class: str
    task: str
    action: str
    resource: str
    diff: Any = None
    decision: str = "report"
    reason: str = ""
    result: str = "not repaired"
    # The live object's drift opt-out annotations (OPT_OUT_ANNOTATIONS); input to the decision, not part of the drift.
    opt_out_annotations: Dict[str, str] = field(default_factory=dict)
    # Other hosts the change was decided from (a fleet class: the GPU nodes whose verdicts the quarantine applies);
    # its repair runs on them too. Not part of the drift.
    reads: List[str] = field(default_factory=list)

    def key(self) -> Tuple[str, str, str, str]:
        return (self.host, self.drift_class, self.task, self.resource)

    def fingerprint(self) -> str:
        """The drift itself (what would change), so an approved plan applies only to the drift that was approved."""
        text = json.dumps([list(self.key()), self.diff], sort_keys=True, default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def as_dict(self) -> Dict[str, Any]:
        return {"host": self.host, "role": self.role, "class": self.drift_class, "task": self.task,
                "action": self.action, "resource": self.resource, "diff": self.diff, "decision": self.decision,
                "reason": self.reason, "result": self.result, "fingerprint": self.fingerprint()}


@dataclass
class CheckResult:
    items: List[DriftItem] = field(default_factory=list)
    unverifiable: List[Dict[str, str]] = field(default_factory=list)
    unreachable: Dict[str, str] = field(default_factory=dict)
    failures: List[Dict[str, str]] = field(default_factory=list)
    hosts: List[str] = field(default_factory=list)


def _k8s_objects(result: Mapping[str, Any]) -> List[Tuple[Dict[str, Any], Mapping[str, Any]]]:
    """(object, its own result) for each object a kubernetes.core.k8s result names; one entry per object of a
    multi-document definition."""
    inner = result.get("result")
    if isinstance(inner, dict) and isinstance(inner.get("results"), list):
        return [(r.get("result") or {}, r) for r in inner["results"] if isinstance(r, dict)]
    if isinstance(inner, dict) and inner.get("kind"):
        return [(inner, result)]
    return []


def _opt_out_subset(obj: Any) -> Dict[str, str]:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return {key: str(value) for key, value in (annotations or {}).items() if key in OPT_OUT_ANNOTATIONS} \
        if isinstance(annotations, dict) else {}


def live_opt_out_annotations(result: Mapping[str, Any]) -> Dict[str, str]:
    """The drift opt-out annotations of the object as it is in the cluster, from one object's kubernetes.core.k8s
    check-mode result. Its diff holds only what would change (an annotation nobody changes is in neither side), so
    the live annotations are those of the object the apply would make (`result`), corrected by the diff: one the
    apply would change or remove has its live value in `before`, one the apply would add (`after` only) is not live.
    A new object (nothing live) has none."""
    diffs = result.get("diff")
    entries = [d for d in (diffs if isinstance(diffs, list) else [diffs]) if isinstance(d, dict)]
    if not entries or not any(isinstance(d.get("before"), dict) and d["before"] for d in entries):
        return {}
    live = _opt_out_subset(result.get("result"))
    for entry in entries:
        before, after = _opt_out_subset(entry.get("before")), _opt_out_subset(entry.get("after"))
        for key in OPT_OUT_ANNOTATIONS:
            if key in before:
                live[key] = before[key]
            elif key in after:
                live.pop(key, None)
    return live


def object_name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    parts = [str(obj.get("kind") or "?")] + ([meta["namespace"]] if meta.get("namespace") else []) + \
        [str(meta.get("name") or "?")]
    return "/".join(parts)


def resource_of(result: Mapping[str, Any]) -> str:
    """A file, package or object a node task changed, from its result (best effort, for people)."""
    args = (result.get("invocation") or {}).get("module_args") or {}
    diffs = result.get("diff") if isinstance(result.get("diff"), list) else [result.get("diff")]
    headers = [d.get("after_header") or d.get("before_header") for d in diffs
               if isinstance(d, dict) and d.get("before") != d.get("after")]
    headers = [h for h in dict.fromkeys(headers) if isinstance(h, str) and h.startswith("/")]
    if headers:
        return ", ".join(headers)
    files = result.get("changed_paths")  # gpu_ops.cluster.host_files: only the files it changed
    if isinstance(files, list) and files:
        return ", ".join(str(f) for f in files)
    for key in ("dest", "path"):
        if isinstance(result.get(key), str):
            return result[key]
        if isinstance(args.get(key), str):
            return args[key]
    paths = [args[key] for key in sorted(args) if key.endswith("_path") and isinstance(args[key], str)]
    if paths:
        return ", ".join(paths)
    packages = result.get("changed_packages")  # gpu_ops.cluster.dpkg_holds: only the packages it changed
    if isinstance(packages, list) and packages:
        return ", ".join(str(p) for p in packages)
    name = args.get("name")
    if isinstance(name, list):
        return ", ".join(str(n) for n in name)
    if isinstance(name, str):
        return name
    if isinstance(result.get("msg"), str) and result["msg"].startswith("(predicted)"):
        return result["msg"]
    return ""


def _results_of(res: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    """A loop task's item results, or the task's own result."""
    if isinstance(res.get("results"), list):
        return [r for r in res["results"] if isinstance(r, dict)]
    return [res]


def is_check_mode_skip(res: Mapping[str, Any]) -> bool:
    text = " ".join(str(res.get(key) or "") for key in ("msg", "skip_reason", "skipped_reason"))
    return "check mode" in text.lower()


def items_from_events(events: Iterable[Mapping[str, Any]]) -> CheckResult:
    """The drift a check-mode run found, from its ansible-runner events in order."""
    found = CheckResult()
    current_role = ""  # the role whose tasks run now: _common's shared tasks count for the role that imported them
    task_roles: Dict[str, str] = {}
    hosts: set = set()
    role_hosts: Dict[str, set] = {}  # role -> the hosts its tasks ran on (what a fleet class's change was read from)
    for event in events:
        kind = event.get("event")
        data = event.get("event_data") or {}
        if kind in ("playbook_on_task_start", "playbook_on_handler_task_start"):
            role = role_name(data.get("role"))
            if role and role != "_common":
                current_role = role
            elif not role:
                current_role = ""
            task_roles[data.get("task_uuid", "")] = current_role
            continue
        if kind == "playbook_on_play_start":
            current_role = ""
            continue
        host = data.get("host")
        if not host:
            continue
        res = data.get("res") or {}
        role = task_roles.get(data.get("task_uuid", ""), role_name(data.get("role")))
        task = str(data.get("task") or "")
        if kind == "runner_on_unreachable":
            found.unreachable[host] = gpu_ops_run.failure_message(res)
            continue
        hosts.add(host)
        role_hosts.setdefault(role, set()).add(host)
        if kind in ("runner_on_failed", "runner_on_async_failed") and not data.get("ignore_errors"):
            found.failures.append({"host": host, "role": role, "task": task, "message": gpu_ops_run.failure_message(res)})
            continue
        if kind == "runner_on_skipped" or (kind == "runner_on_ok" and res.get("skipped")):
            if is_check_mode_skip(res):
                found.unverifiable.append({"host": host, "role": role, "task": task,
                                           "reason": gpu_ops_run.failure_message(res)})
            continue
        hidden = bool(res.get("censored")) or bool(res.get("_ansible_no_log"))
        # A no_log result is censored down to a message, without `changed`; the line the run printed still says it.
        changed = res.get("changed") if not hidden or "changed" in res else \
            gpu_ops_run.ANSI.sub("", str(event.get("stdout") or "")).lstrip().startswith("changed:")
        if kind not in CHANGED_EVENTS or not changed:
            continue
        action = str(data.get("resolved_action") or data.get("task_action") or "")
        reads = sorted(role_hosts[role] - {host}) if CLASSES[class_of(role)]["scope"] == "fleet" else []
        if hidden:
            found.items.append(DriftItem(host=host, role=role, drift_class=class_of(role), task=task, action=action,
                                         resource="", diff=HIDDEN))
            continue
        for result in _results_of(res):
            if not result.get("changed") and result is not res:
                continue
            objects = _k8s_objects(result)
            if objects:
                for obj, own in objects:
                    if own is not result and not own.get("changed", True):
                        continue
                    found.items.append(DriftItem(
                        host=host, role=role, drift_class=class_of(role, obj.get("kind")), task=task, action=action,
                        resource=object_name(obj), diff=diff_of(own, obj.get("kind")),
                        opt_out_annotations=live_opt_out_annotations(own), reads=reads))
                continue
            found.items.append(DriftItem(
                host=host, role=role, drift_class=class_of(role), task=task, action=action,
                resource=resource_of(result), diff=diff_of(result), reads=reads))
    found.hosts = sorted(hosts | set(found.unreachable))
    return found


def read_events(artifact_dir: Path) -> List[Dict[str, Any]]:
    """A run's events from its job_events/ directory, in the order they happened (counter)."""
    events = []
    for path in (artifact_dir / "job_events").glob("*.json"):
        try:
            events.append(json.loads(path.read_text(encoding="utf-8")))
        except ValueError:
            continue  # a partial file of a killed run
    return sorted(events, key=lambda e: e.get("counter", 0))


# --- policy and opt-outs --------------------------------------------------------------------------------------------

@dataclass
class Policy:
    actions: Dict[str, str]
    opt_outs: List[Dict[str, Any]]
    serial: Any = 1
    max_fail_percentage: int = 0

    def action(self, drift_class: str) -> str:
        return "report" if drift_class == "other" else self.actions.get(drift_class, "report")


def _parse_date(value: Any, path: str) -> dt.date:
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            pass
    raise DriftInputError(f"{path}={value!r}; allowed: a date YYYY-MM-DD (the last day the opt-out holds)")


def parse_policy(variables: Mapping[str, Any], today: dt.date) -> Tuple[Policy, List[str]]:
    """The drift settings from the inventory's variables; bad input raises DriftInputError naming the variable's
    full path, its value and what is allowed. Returns the policy and notes (expired opt-outs)."""
    raw = variables.get("gpu_drift_policy", {})
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise DriftInputError(f"gpu_drift_policy={raw!r}; allowed: a mapping of drift class to one of "
                              f"{', '.join(ACTIONS)}")
    actions: Dict[str, str] = {}
    for name, action in raw.items():
        if name not in REPAIRABLE:
            raise DriftInputError(f"gpu_drift_policy.{name} is not a drift class; allowed: {', '.join(REPAIRABLE)}")
        if action not in ACTIONS:
            raise DriftInputError(f"gpu_drift_policy.{name}={action!r}; allowed: {', '.join(ACTIONS)}")
        actions[name] = action
    serial = variables.get("gpu_drift_repair_serial", 1)
    if isinstance(serial, bool) or not (
            (isinstance(serial, int) and serial >= 1)
            or (isinstance(serial, str) and re.fullmatch(r"([1-9][0-9]?|100)%", serial))):
        raise DriftInputError(f"gpu_drift_repair_serial={serial!r}; allowed: a positive count of nodes or a "
                              f"percentage such as '25%'")
    budget = variables.get("gpu_drift_repair_max_fail_percentage", 0)
    if isinstance(budget, bool) or not isinstance(budget, int) or not 0 <= budget <= 100:
        raise DriftInputError(f"gpu_drift_repair_max_fail_percentage={budget!r}; allowed: an integer 0 to 100 "
                              f"(0: stop at the first node that fails)")
    raw_outs = variables.get("gpu_drift_opt_out", []) or []
    if not isinstance(raw_outs, list):
        raise DriftInputError(f"gpu_drift_opt_out={raw_outs!r}; allowed: a list of {{host or resource, until, reason}}")
    opt_outs, notes = [], []
    for index, entry in enumerate(raw_outs):
        path = f"gpu_drift_opt_out[{index}]"
        if not isinstance(entry, dict):
            raise DriftInputError(f"{path}={entry!r}; allowed: a mapping with host or resource, until and reason")
        unknown = sorted(set(entry) - {"host", "resource", "until", "reason"})
        if unknown:
            raise DriftInputError(f"{path}.{unknown[0]} is not a known key; allowed: host, resource, until, reason")
        if ("host" in entry) == ("resource" in entry):
            raise DriftInputError(f"{path}={entry!r}; allowed: exactly one of host (a host pattern) or resource "
                                  f"(Kind/namespace/name, * allowed)")
        target = entry.get("host", entry.get("resource"))
        if not isinstance(target, str) or not target:
            key = "host" if "host" in entry else "resource"
            raise DriftInputError(f"{path}.{key}={target!r}; allowed: a non-empty string")
        if "until" not in entry:
            raise DriftInputError(f"{path}.until is missing; allowed: a date YYYY-MM-DD (opt-outs expire)")
        until = _parse_date(entry["until"], f"{path}.until")
        reason = entry.get("reason", "")
        if not isinstance(reason, str):
            raise DriftInputError(f"{path}.reason={reason!r}; allowed: a string")
        record = {"host": entry.get("host"), "resource": entry.get("resource"), "until": until.isoformat(),
                  "reason": reason, "source": path}
        if until < today:
            notes.append(f"{path} ({target}) expired on {until.isoformat()}: checked and handled as usual")
            continue
        opt_outs.append(record)
    return Policy(actions=actions, opt_outs=opt_outs, serial=serial, max_fail_percentage=budget), notes


# The Kinds of the objects the cluster roles manage, by their lower-case spelling (for the note on a misspelt one).
KINDS = {kind.lower(): kind for kind in (
    "ConfigMap", "DaemonSet", "Deployment", "Service", "ServiceAccount", "Secret", "Namespace", "Node", "Job", "CronJob",
    "ResourceQuota", "LimitRange", "NetworkPolicy", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
    "RuntimeClass", "PriorityClass", "DeviceClass", "ResourceClaimTemplate", "PersistentVolumeClaim",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterQueue", "LocalQueue", "ResourceFlavor",
    "Cohort", "PrometheusRule", "ServiceMonitor")}
# The inventory variables the runner reads, from the first cluster_control host (group_vars of all or of that host).
SETTINGS = ("gpu_drift_policy", "gpu_drift_opt_out", "gpu_drift_repair_serial", "gpu_drift_repair_max_fail_percentage")


def settings_notes(policy: Policy, variables: Mapping[str, Any], control: Sequence[str],
                   hostvars: Mapping[str, Mapping[str, Any]], groups: Sequence[str]) -> List[str]:
    """What the user wrote that the run would silently not use: a drift setting set on another host than the one it
    is read from (group_vars of gpu_nodes, host_vars of a node) with another value; an opt-out host pattern that
    matches no host of the inventory (a group's name, most often); a resource opt-out whose Kind is not spelled as
    the API spells it (resources are Kind/namespace/name, case-sensitive)."""
    notes = []
    reader = control[0] if control else "group all"
    for name in SETTINGS:
        elsewhere = sorted(host for host, values in hostvars.items()
                           if host not in control[:1] and name in values and values[name] != variables.get(name))
        if elsewhere:
            shown = ", ".join(elsewhere[:5]) + (f" and {len(elsewhere) - 5} more" if len(elsewhere) > 5 else "")
            notes.append(f"{name} is set for {shown} with another value than the runner reads ({reader}'s): "
                         f"the runner ignores it; put it in group_vars of all or of cluster_control")
    hosts = list(hostvars)
    for entry in policy.opt_outs:
        pattern = entry.get("host")
        if pattern and not any(fnmatch.fnmatchcase(host, pattern) for host in hosts):
            hint = (f" ({pattern} is a group: host takes host names or patterns such as gpu-h100-*)"
                    if pattern in groups else "")
            notes.append(f"{entry['source']}.host={pattern!r} matches no host of the inventory{hint}")
        resource = entry.get("resource") or ""
        kind = resource.split("/", 1)[0]
        if "/" in resource and kind[:1].islower():
            spelt = KINDS.get(kind.lower(), "ConfigMap, DaemonSet, ...")
            notes.append(f"{entry['source']}.resource={resource!r} matches nothing: a resource is Kind/namespace/name "
                         f"with the Kind as the API spells it ({spelt}, not {kind})")
    return notes


def annotation_opt_outs(items: Sequence[DriftItem], today: dt.date) -> Tuple[List[Dict[str, Any]], List[str]]:
    """The opt-outs the drifted objects carry themselves (OPT_OUT_UNTIL, optionally OPT_OUT_REASON), each as an entry
    like gpu_drift_opt_out's for that one object, and notes on expired or malformed dates. An object's annotation is
    not inventory input: a bad one is noted and ignored (the item is handled as usual), never a failed run."""
    entries: List[Dict[str, Any]] = []
    notes: List[str] = []
    seen = set()
    for item in items:
        value = item.opt_out_annotations.get(OPT_OUT_UNTIL)
        if value is None or item.resource in seen:
            continue
        seen.add(item.resource)
        where = f"{OPT_OUT_UNTIL} annotation on {item.resource}"
        try:
            # fromisoformat alone would also take other ISO 8601 forms (20261231, 2026-W52-4).
            until = dt.date.fromisoformat(value) if re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", value) else None
        except ValueError:
            until = None
        if until is None:
            notes.append(f"{where}: {value!r} is not a date YYYY-MM-DD; ignored")
        elif until < today:
            notes.append(f"{where} expired on {until.isoformat()}: checked and handled as usual")
        else:
            entries.append({"host": None, "resource": item.resource, "until": until.isoformat(),
                            "reason": item.opt_out_annotations.get(OPT_OUT_REASON, ""),
                            "source": f"annotation {OPT_OUT_UNTIL}"})
    return entries, notes


def opt_out_for(item: DriftItem, opt_outs: Sequence[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    for entry in opt_outs:
        if entry.get("host") and fnmatch.fnmatchcase(item.host, entry["host"]):
            return entry
        if entry.get("resource") and fnmatch.fnmatchcase(item.resource, entry["resource"]):
            return entry
    return None


def decide(items: Sequence[DriftItem], policy: Policy, detect_only: bool = False) -> None:
    """Each item's decision: opted_out, report, approve or repair; a repair is held when its role would also change
    a drifted class not to be repaired, or an opted-out item on the same host (a role repairs all it owns at once)."""
    for item in items:
        entry = opt_out_for(item, policy.opt_outs)
        if entry:
            item.decision, item.result = "opted_out", "left alone"
            target = entry.get("host") or entry.get("resource")
            item.reason = f"opted out by {entry.get('source', 'gpu_drift_opt_out')} ({target}) until {entry['until']}" \
                + (f": {entry['reason']}" if entry["reason"] else "")
        elif detect_only:
            item.decision, item.reason = "report", "detection only (--detect-only)"
        else:
            item.decision = policy.action(item.drift_class)
            item.reason = f"gpu_drift_policy.{item.drift_class}={item.decision}" if item.drift_class in policy.actions \
                else ("never repaired" if item.drift_class == "other" else "default: report")
    for item in items:
        # A host opted out is left alone, also by a fleet repair: without its verdict, its node stays as it is.
        item.reads = [host for host in item.reads
                      if not any(e.get("host") and fnmatch.fnmatchcase(host, e["host"]) for e in policy.opt_outs)]
    not_repaired = {item.drift_class for item in items if item.decision != "repair"}
    opted_out = [item for item in items if item.decision == "opted_out"]
    for item in items:
        if item.decision != "repair":
            continue
        roles = class_tags([item.drift_class])
        shared = sorted(c for c in classes_of_tags(roles) if c != item.drift_class and c in not_repaired)
        spared = [other for other in opted_out
                  if other.host == item.host and set(class_tags([other.drift_class])) & set(roles)]
        if shared:
            item.decision = "held"
            item.reason = (f"{item.drift_class}'s repair runs the {'/'.join(roles)} role, "
                           f"which would also change {', '.join(shared)}, whose drift is not to be repaired")
        elif spared:
            item.decision = "held"
            item.reason = (f"{item.drift_class}'s repair runs the {'/'.join(roles)} role on {item.host}, which would "
                           f"also change {spared[0].resource or spared[0].task}, opted out")


def repair_scope(items: Sequence[DriftItem], cluster_hosts: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(tags, limit) of the repair run for the items decided repair (or approved)."""
    chosen = [item for item in items if item.decision in ("repair", "approved")]
    tags = class_tags({item.drift_class for item in chosen})
    hosts = {item.host for item in chosen}
    if any(CLASSES[item.drift_class]["scope"] in ("cluster", "fleet") for item in chosen):
        hosts.update(cluster_hosts)
    for item in chosen:
        hosts.update(item.reads)
    return tags, sorted(hosts)


# --- report, summary, metrics ---------------------------------------------------------------------------------------

def run_result(check: CheckResult, items: Sequence[DriftItem], failed: bool) -> str:
    if failed:
        return "failed"
    if not items and not check.unreachable:
        return "in_sync"
    if items and all(item.result == "repaired" for item in items) and not check.unreachable:
        return "repaired"
    return "drift"


EXIT_CODES = {"in_sync": EXIT_IN_SYNC, "drift": EXIT_DRIFT, "repaired": EXIT_REPAIRED, "failed": EXIT_FAILED}


def report_document(*, ident: str, started: dt.datetime, finished: dt.datetime, inventories: Sequence[str],
                    playbook: str,
                    check: CheckResult, items: Sequence[DriftItem], result: str, notes: Sequence[str],
                    runs: Sequence[Mapping[str, Any]], policy: Policy, detect_only: bool,
                    plan: Optional[str]) -> Dict[str, Any]:
    counts: Dict[str, int] = {}
    for item in items:
        counts[item.decision] = counts.get(item.decision, 0) + 1
    return {
        "schema": SCHEMA,
        "ident": ident,
        "started": gpu_ops_run.utc_stamp(started),
        "finished": gpu_ops_run.utc_stamp(finished),
        "duration_s": round((finished - started).total_seconds(), 3),
        "inventory": list(inventories),
        "playbook": playbook,
        "result": result,
        "exit_code": EXIT_CODES[result],
        "detect_only": detect_only,
        "policy": {name: policy.action(name) for name in REPAIRABLE},
        "opt_outs": list(policy.opt_outs),
        "hosts": check.hosts,
        "unreachable": [{"host": host, "message": message} for host, message in sorted(check.unreachable.items())],
        "failures": list(check.failures),
        "unverifiable": list(check.unverifiable),
        "counts": {"items": len(items), **counts},
        "items": [item.as_dict() for item in items],
        "plan": plan,
        "runs": list(runs),
        "notes": list(notes),
    }


def format_summary(report: Mapping[str, Any]) -> str:
    """The readable summary beside the report."""
    lines = [f"drift {report['ident']}: {report['result']} (exit {report['exit_code']}) in "
             f"{report['duration_s']:.1f}s, {len(report['hosts'])} host(s)"]
    items = report["items"]
    if items:
        width = max(len("host"), *(len(i["host"]) for i in items))
        cwidth = max(len("class"), *(len(i["class"]) for i in items))
        lines.append(f"  {'host'.ljust(width)}  {'class'.ljust(cwidth)}  {'decision':<10} {'result':<14} resource / task")
        for item in items:
            what = item["resource"] or item["task"]
            lines.append(f"  {item['host'].ljust(width)}  {item['class'].ljust(cwidth)}  {item['decision']:<10} "
                         f"{item['result']:<14} {what}  [{item['task']}]")
    else:
        lines.append("  no drift")
    for entry in report["unreachable"]:
        lines.append(f"  UNREACHABLE {entry['host']}: {entry['message']}")
    for entry in report["failures"]:
        lines.append(f"  FAILED {entry['host']}: {entry['task']}: {entry['message']}")
    if report["unverifiable"]:
        lines.append(f"  {len(report['unverifiable'])} task(s) check mode cannot verify (listed in the report):")
        for entry in report["unverifiable"][:10]:
            lines.append(f"    {entry['host']}: {entry['task']}")
    if report.get("plan"):
        lines.append(f"  awaiting approval: gpu_ops_drift apply {report['plan']}")
    lines.extend(f"  note: {note}" for note in report["notes"])
    return "\n".join(lines)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def metrics_text(report: Mapping[str, Any], last_success: Optional[float]) -> str:
    """The run as Prometheus text-format metrics (node_exporter textfile collector)."""
    finished = dt.datetime.strptime(report["finished"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    stamp = finished.timestamp()
    success = stamp if report["result"] != "failed" else last_success
    out = [
        "# HELP gpu_drift_last_run_timestamp_seconds When the last drift run finished.",
        "# TYPE gpu_drift_last_run_timestamp_seconds gauge",
        f"gpu_drift_last_run_timestamp_seconds {stamp:.0f}",
        "# HELP gpu_drift_last_success_timestamp_seconds When the last drift run that did not fail finished.",
        "# TYPE gpu_drift_last_success_timestamp_seconds gauge",
        f"gpu_drift_last_success_timestamp_seconds {success:.0f}" if success is not None else
        "gpu_drift_last_success_timestamp_seconds 0",
        "# HELP gpu_drift_last_run_duration_seconds How long the last drift run took.",
        "# TYPE gpu_drift_last_run_duration_seconds gauge",
        f"gpu_drift_last_run_duration_seconds {report['duration_s']}",
        "# HELP gpu_drift_last_run_result The last drift run's result (1 for the one it had).",
        "# TYPE gpu_drift_last_run_result gauge",
    ]
    out += [f'gpu_drift_last_run_result{{result="{name}"}} {1 if report["result"] == name else 0}'
            for name in ("in_sync", "drift", "repaired", "failed")]
    detected: Dict[Tuple[str, str], int] = {}
    repaired: Dict[Tuple[str, str], int] = {}
    repair_failed: Dict[Tuple[str, str], int] = {}
    for item in report["items"]:
        key = (item["class"], item["host"])
        if item["result"] != "repaired":
            detected[key] = detected.get(key, 0) + 1
        if item["result"] == "repaired":
            repaired[key] = repaired.get(key, 0) + 1
        if item["result"] == "repair failed":
            repair_failed[key] = repair_failed.get(key, 0) + 1
    for name, help_text, values in (
            ("gpu_drift_detected", "Drifted items the last run left in place, per class and host.", detected),
            ("gpu_drift_repaired", "Drifted items the last run repaired (confirmed by its re-check).", repaired),
            ("gpu_drift_repair_failed", "Drifted items the last run tried to repair and still found.", repair_failed)):
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        out += [f'{name}{{class="{_label(c)}",host="{_label(h)}"}} {n}' for (c, h), n in sorted(values.items())]
    unverifiable: Dict[str, int] = {}
    for entry in report["unverifiable"]:
        unverifiable[entry["host"]] = unverifiable.get(entry["host"], 0) + 1
    out += ["# HELP gpu_drift_unverifiable_tasks Tasks check mode could not verify in the last run, per host.",
            "# TYPE gpu_drift_unverifiable_tasks gauge"]
    out += [f'gpu_drift_unverifiable_tasks{{host="{_label(h)}"}} {n}' for h, n in sorted(unverifiable.items())]
    out += ["# HELP gpu_drift_unreachable_hosts Hosts the last drift run could not reach.",
            "# TYPE gpu_drift_unreachable_hosts gauge", f"gpu_drift_unreachable_hosts {len(report['unreachable'])}"]
    return "\n".join(out) + "\n"


def previous_success(metrics_file: Path) -> Optional[float]:
    """gpu_drift_last_success_timestamp_seconds of the previous metrics file, kept over a failed run."""
    try:
        for line in metrics_file.read_text(encoding="utf-8").splitlines():
            if line.startswith("gpu_drift_last_success_timestamp_seconds "):
                value = float(line.split()[1])
                return value or None
    except (OSError, ValueError, IndexError):
        return None
    return None


def write_atomically(path: Path, text: str) -> None:
    """Write beside the target, then rename over it: a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# --- the runs ----------------------------------------------------------------------------------------------------------

class Locked(RuntimeError):
    pass


class RunLock:
    """One drift run at a time per reports directory (flock: released when the process ends, even killed)."""

    def __init__(self, path: Path):
        self.path = path
        self.handle: Optional[TextIO] = None

    def __enter__(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.seek(0)
            holder = self.handle.read().strip() or "unknown"
            self.handle.close()
            raise Locked(f"another drift run holds {self.path} ({holder}); this run did nothing")
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(f"pid {os.getpid()} since {gpu_ops_run.utc_stamp(dt.datetime.now(dt.timezone.utc))}\n")
        self.handle.flush()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.handle:
            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()


def inventory_variables(inventories: Sequence[str], cwd: Path
                        ) -> Tuple[Dict[str, Any], List[str], Dict[str, Any], List[str]]:
    """(the variables of group all as a control host sees them, the cluster_control hosts, hostvars, group names)
    from ansible-inventory, which merges group_vars and host_vars as a run does (values as written: no templating)."""
    command = [str(Path(sys.executable).parent / "ansible-inventory")]
    if not Path(command[0]).exists():
        command = ["ansible-inventory"]
    for source in inventories:
        command += ["-i", gpu_ops_run.resolve_inventory(source, cwd)]
    done = subprocess.run(command + ["--list"], cwd=cwd, capture_output=True, text=True, check=False, timeout=300)
    if done.returncode != 0:
        raise DriftInputError(f"ansible-inventory could not read {', '.join(inventories)}: "
                              f"{gpu_ops_run.failure_message({'stderr': done.stderr})}")
    data = json.loads(done.stdout)
    hostvars = (data.get("_meta") or {}).get("hostvars") or {}
    control = list((data.get("cluster_control") or {}).get("hosts") or [])
    variables = dict(hostvars.get(control[0], {})) if control else dict((data.get("all") or {}).get("vars") or {})
    return variables, control, hostvars, [name for name in data if name != "_meta"]


@dataclass
class DriftRequest:
    inventories: Tuple[str, ...]
    reports: str
    # The desired state checked; another playbook only for tests.
    playbook: str = PLAYBOOK
    metrics_file: Optional[str] = None
    detect_only: bool = False
    extravars: Mapping[str, Any] = field(default_factory=dict)
    envvars: Mapping[str, str] = field(default_factory=dict)
    process_isolation_executable: Optional[str] = None
    container_image: Optional[str] = None
    container_volumes: Tuple[str, ...] = ()
    container_options: Tuple[str, ...] = ()
    limit: Optional[str] = None
    timeout: Optional[int] = None
    cwd: Optional[str] = None


SKIPS_CALLBACK = "gpu_ops.cluster.check_mode_skips"
# The collection's filters imported once before the workers fork (plugins/callback/preload.py): about a quarter of a
# no-op node run's controller CPU.
PRELOAD_CALLBACK = "gpu_ops.cluster.preload"


def callbacks_enabled(given: str | None) -> str:
    """ANSIBLE_CALLBACKS_ENABLED for a run: the callbacks the caller named, then the two the runner needs, once each."""
    names = [name.strip() for name in ",".join(filter(None, (given, SKIPS_CALLBACK, PRELOAD_CALLBACK))).split(",")]
    return ",".join(dict.fromkeys(name for name in names if name))


def _run(request: DriftRequest, run_dir: Path, name: str, *, check: bool, tags: Optional[List[str]] = None,
         limit: Optional[str] = None, extravars: Optional[Mapping[str, Any]] = None,
         out: TextIO) -> Tuple[gpu_ops_run.RunOutcome, Path]:
    """One run of the playbook; returns its outcome and the file where the check_mode_skips callback wrote why each
    task was skipped (ansible-runner's events keep no reason)."""
    print(f"--- {name}: {request.playbook}{' --check --diff' if check else ''}"
          f"{' --tags ' + ','.join(tags) if tags else ''}{' --limit ' + limit if limit else ''}", file=out, flush=True)
    artifacts = run_dir / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    skips = artifacts / f"skips-{name}.jsonl"
    skips.touch()
    container = request.process_isolation_executable in gpu_ops_run.CONTAINER_ENGINES
    enabled = callbacks_enabled(request.envvars.get("ANSIBLE_CALLBACKS_ENABLED")
                                or os.environ.get("ANSIBLE_CALLBACKS_ENABLED"))
    envvars = {**request.envvars, "ANSIBLE_CALLBACKS_ENABLED": enabled,
               # In a container the artifacts directory is mounted at /runner/artifacts (gpu_ops_run).
               "GPU_CHECK_MODE_SKIPS": f"/runner/artifacts/{skips.name}" if container else str(skips)}
    run_request = gpu_ops_run.RunRequest(
        playbook=request.playbook, inventories=request.inventories, artifacts=str(artifacts), check=check,
        diff=True, limit=limit, tags=",".join(tags) if tags else None,
        extravars={**request.extravars, **(extravars or {})}, envvars=envvars,
        process_isolation_executable=request.process_isolation_executable, container_image=request.container_image,
        container_volumes=request.container_volumes, container_options=request.container_options,
        timeout=request.timeout, ident=f"{run_dir.name}-{name}", cwd=request.cwd)
    return gpu_ops_run.run_playbook(run_request, out=out), skips


def unverifiable_from_skips(lines: Iterable[str]) -> List[Dict[str, str]]:
    """The tasks check mode skipped (not those skipped by a condition), from check_mode_skips' lines."""
    found, seen = [], set()
    for line in lines:
        try:
            skip = json.loads(line)
        except ValueError:
            continue  # the last line of a killed run
        if not skip.get("check_mode") or "check mode" not in str(skip.get("reason", "")).lower():
            continue
        entry = {"host": str(skip.get("host", "")), "role": role_name(skip.get("role")),
                 "task": str(skip.get("task", "")), "reason": str(skip.get("reason", ""))}
        key = (entry["host"], entry["task"], skip.get("task_uuid"))
        if key not in seen:
            seen.add(key)
            found.append(entry)
    return found


def check_result(outcome: gpu_ops_run.RunOutcome, skips: Path) -> CheckResult:
    found = items_from_events(read_events(outcome.artifact_dir))
    reported = {(u["host"], u["task"]) for u in found.unverifiable}
    text = skips.read_text(encoding="utf-8") if skips.exists() else ""
    found.unverifiable += [u for u in unverifiable_from_skips(text.splitlines())
                           if (u["host"], u["task"]) not in reported]
    return found


def _run_record(name: str, outcome: gpu_ops_run.RunOutcome) -> Dict[str, Any]:
    return {"name": name, "ident": outcome.ident, "status": outcome.status, "rc": outcome.rc,
            "artifact_dir": str(outcome.artifact_dir)}


def repair_and_recheck(request: DriftRequest, run_dir: Path, items: List[DriftItem], policy: Policy,
                       cluster_hosts: Sequence[str], runs: List[Dict[str, Any]], out: TextIO) -> bool:
    """Repair the items decided repair/approved, then check those classes again; True when it ran without failure."""
    chosen = [item for item in items if item.decision in ("repair", "approved")]
    if not chosen:
        return True
    tags, hosts = repair_scope(chosen, cluster_hosts)
    limit = ",".join(hosts)
    # The node roles' play rolls through the nodes in batches and stops when the failure budget is spent.
    extravars = {"gpu_nodes_serial": policy.serial, "gpu_nodes_max_fail_percentage": policy.max_fail_percentage}
    repair, _ = _run(request, run_dir, "repair", check=False, tags=tags, limit=limit, extravars=extravars, out=out)
    runs.append(_run_record("repair", repair))
    recheck, skips = _run(request, run_dir, "recheck", check=True, tags=tags, limit=limit, out=out)
    runs.append(_run_record("recheck", recheck))
    still = {item.key() for item in check_result(recheck, skips).items}
    for item in chosen:
        item.result = "repair failed" if item.key() in still or repair.rc != 0 else "repaired"
    return repair.rc == 0 and recheck.rc == 0 and not any(item.result == "repair failed" for item in chosen)


def finish(request: DriftRequest, run_dir: Path, ident: str, started: dt.datetime, check: CheckResult,
           items: List[DriftItem], failed: bool, notes: List[str], runs: List[Dict[str, Any]], policy: Policy,
           plan: Optional[str], out: TextIO) -> int:
    result = run_result(check, items, failed)
    report = report_document(ident=ident, started=started, finished=dt.datetime.now(dt.timezone.utc),
                             inventories=[gpu_ops_run.resolve_inventory(i, Path(request.cwd or os.getcwd()))
                                          for i in request.inventories],
                             playbook=request.playbook, check=check, items=items, result=result, notes=notes, runs=runs, policy=policy,
                             detect_only=request.detect_only, plan=plan)
    text = json.dumps(report, indent=2, sort_keys=True, default=str) + "\n"
    write_atomically(run_dir / "drift.json", text)
    summary = format_summary(report)
    write_atomically(run_dir / "drift.txt", summary + "\n")
    write_atomically(run_dir.parent / "latest.json", text)
    metrics = Path(request.metrics_file) if request.metrics_file else run_dir.parent / "gpu_drift.prom"
    write_atomically(metrics, metrics_text(report, previous_success(metrics)))
    print(summary, file=out)
    print(f"report: {run_dir / 'drift.json'}  metrics: {metrics}", file=out, flush=True)
    return report["exit_code"]


def _start(request: DriftRequest, out: TextIO, ident: Optional[str] = None
           ) -> Tuple[Path, str, dt.datetime, Policy, List[str], List[str], Dict[str, Any]]:
    cwd = Path(request.cwd or os.getcwd())
    started = dt.datetime.now(dt.timezone.utc)
    variables, control, hostvars, groups = inventory_variables(request.inventories, cwd)
    policy, notes = parse_policy({**variables, **request.extravars}, started.date())
    notes += settings_notes(policy, variables, control, hostvars, groups)
    ident = ident or gpu_ops_run.new_ident(started)
    run_dir = (cwd / request.reports).resolve() / ident
    run_dir.mkdir(parents=True, exist_ok=False)
    print(f"drift {ident}: {', '.join(request.inventories)}", file=out, flush=True)
    return run_dir, ident, started, policy, notes, control, hostvars


def check_command(request: DriftRequest, out: TextIO = sys.stdout) -> int:
    run_dir, ident, started, policy, notes, control, _ = _start(request, out)
    runs: List[Dict[str, Any]] = []
    outcome, skips = _run(request, run_dir, "check", check=True, limit=request.limit, out=out)
    runs.append(_run_record("check", outcome))
    check = check_result(outcome, skips)
    # ansible-playbook's rc 4: only hosts unreachable (reported, not a failed run); any other non-zero rc: failed.
    failed = bool(check.failures) or outcome.rc not in (0, 4)
    found, found_notes = annotation_opt_outs(check.items, started.date())
    policy = replace(policy, opt_outs=policy.opt_outs + found)
    notes += found_notes
    decide(check.items, policy, request.detect_only)
    plan_path = None
    if not failed:
        if not repair_and_recheck(request, run_dir, check.items, policy, control, runs, out):
            failed = True
        approve = [item for item in check.items if item.decision == "approve"]
        if approve:
            for item in approve:
                item.result = "awaiting approval"
            plan_path = str(run_dir / "plan.json")
            write_atomically(Path(plan_path), json.dumps(plan_document(ident, request, approve, control),
                                                         indent=2, sort_keys=True) + "\n")
    return finish(request, run_dir, ident, started, check, check.items, failed, notes, runs, policy, plan_path, out)


def plan_document(ident: str, request: DriftRequest, items: Sequence[DriftItem],
                  cluster_hosts: Sequence[str]) -> Dict[str, Any]:
    approved = [copy.copy(item) for item in items]
    for item in approved:
        item.decision = "approved"
    tags, hosts = repair_scope(approved, cluster_hosts)
    return {"schema": PLAN_SCHEMA, "from_run": ident, "inventory": list(request.inventories), "tags": tags,
            "limit": hosts, "items": [item.as_dict() for item in items]}


def apply_command(request: DriftRequest, plan_file: Path, out: TextIO = sys.stdout) -> int:
    """Carry out an approved plan: check its scope again first, and change nothing unless the drift found now is the
    drift that was approved (the same items, or fewer)."""
    plan = json.loads(plan_file.read_text(encoding="utf-8"))
    if plan.get("schema") != PLAN_SCHEMA:
        raise DriftInputError(f"{plan_file}: plan schema {plan.get('schema')!r}; allowed: {PLAN_SCHEMA}")
    run_dir, ident, started, policy, notes, control, _ = _start(request, out)
    notes.append(f"applies the plan of run {plan['from_run']} ({plan_file})")
    runs: List[Dict[str, Any]] = []
    outcome, skips = _run(request, run_dir, "check", check=True, tags=plan["tags"], limit=",".join(plan["limit"]),
                          out=out)
    runs.append(_run_record("check", outcome))
    check = check_result(outcome, skips)
    approved = {i["fingerprint"] for i in plan["items"]}
    failed = bool(check.failures) or outcome.rc not in (0, 4)
    unapproved = [item for item in check.items if item.fingerprint() not in approved]
    for item in check.items:
        item.decision = "approved" if item.fingerprint() in approved else "report"
        item.reason = f"approved in the plan of run {plan['from_run']}" if item.fingerprint() in approved else \
            "found in the plan's scope but not in the plan (or changed since)"
    if unapproved:
        for item in check.items:
            item.decision, item.result = "held", "not repaired"
        notes.append(f"nothing changed: {len(unapproved)} drifted item(s) in the plan's scope were not approved "
                     f"(first: {unapproved[0].host} {unapproved[0].resource or unapproved[0].task}); run check again")
        failed = True
    elif not failed and check.items:
        if not repair_and_recheck(request, run_dir, check.items, policy, control, runs, out):
            failed = True
    elif not check.items:
        notes.append("nothing to apply: the approved drift is gone")
    return finish(request, run_dir, ident, started, check, check.items, failed, notes, runs, policy, None, out)


# --- command line ----------------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu_ops_drift", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("check", "detect drift; repair or plan what the policy says"),
                            ("apply", "carry out an approved plan (checks again first)")):
        command = sub.add_parser(name, help=help_text)
        if name == "apply":
            command.add_argument("plan", help="plan.json of a check run")
        command.add_argument("-i", "--inventory", action="append", required=True, dest="inventories")
        command.add_argument("--reports", default="reports/drift", metavar="DIR",
                             help="where each run's report, summary and artifacts go (default: reports/drift)")
        command.add_argument("--metrics-file", metavar="FILE",
                             help="metrics in the text format, replaced atomically (default: REPORTS/gpu_drift.prom; "
                                  "point it into node_exporter's textfile directory)")
        command.add_argument("--extravars", action="append", default=[], metavar="JSON|@FILE")
        command.add_argument("--envvars", action="append", default=[], metavar="NAME=VALUE|JSON|@FILE")
        command.add_argument("--process-isolation-executable", choices=gpu_ops_run.CONTAINER_ENGINES)
        command.add_argument("--container-image")
        command.add_argument("--container-volume", action="append", default=[])
        command.add_argument("--container-option", action="append", default=[])
        command.add_argument("--timeout", type=int, help="seconds each playbook run may take")
        if name == "check":
            command.add_argument("--limit", help="host pattern to check (default: every host)")
            command.add_argument("--detect-only", action="store_true",
                                 help="report everything whatever the policy says (nothing changes)")
    return parser


def request_from_args(args: argparse.Namespace, cwd: Path) -> DriftRequest:
    extravars: Dict[str, Any] = {}
    for value in args.extravars:
        extravars.update(gpu_ops_run.parse_mapping_arg(value, cwd))
    return DriftRequest(
        inventories=tuple(args.inventories), reports=args.reports, metrics_file=args.metrics_file,
        detect_only=getattr(args, "detect_only", False), extravars=extravars,
        envvars=gpu_ops_run.parse_envvars(args.envvars, cwd),
        process_isolation_executable=args.process_isolation_executable, container_image=args.container_image,
        container_volumes=tuple(args.container_volume), container_options=tuple(args.container_option),
        limit=getattr(args, "limit", None), timeout=args.timeout, cwd=str(cwd))


def main(argv: Optional[Sequence[str]] = None, out: TextIO = sys.stdout) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    cwd = Path.cwd()
    try:
        request = request_from_args(args, cwd)
        with RunLock((cwd / request.reports).resolve() / "drift.lock"):
            if args.command == "apply":
                return apply_command(request, (cwd / args.plan).resolve(), out)
            return check_command(request, out)
    except Locked as exc:
        print(f"gpu_ops_drift: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    except (DriftInputError, gpu_ops_run.UsageError) as exc:
        print(f"gpu_ops_drift: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
