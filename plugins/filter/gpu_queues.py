# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Team queues for Kueue (the gpu_queues role): the checks of its settings and of the teams' queue data, the
ResourceFlavors, ClusterQueues and LocalQueues it applies, and Kueue's CRDs prepared for the role's namespace."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_values import (
    LABEL_KEY_ALLOWED, is_dns_label, is_label_key, is_label_value, parse_quantity, quantity_problem)

API = "kueue.x-k8s.io/v1beta2"
MANAGED_LABELS = {"app.kubernetes.io/managed-by": "gpu-cluster", "app.kubernetes.io/part-of": "gpu-queues"}
QUEUE_KEYS = ("flavor", "borrowing_limit", "lending_limit", "weight")
# The CRDs whose older version (v1beta1) Kueue converts through its webhook (kustomize's webhook_in_*.yaml upstream).
CONVERTED_CRDS = ("localqueues.kueue.x-k8s.io", "clusterqueues.kueue.x-k8s.io", "workloads.kueue.x-k8s.io",
                  "cohorts.kueue.x-k8s.io", "multikueueclusters.kueue.x-k8s.io")
CRD_VERSION_LABEL = "gpu-cluster.dev/kueue-version"
TOLERATION_KEYS = {"key", "operator", "value", "effect"}
# A ClusterQueue covers cpu, memory and every GPU resource; its CRD allows at most 64 covered resources per group.
MAX_GPU_RESOURCES = 64 - 2
# Kueue's fair-sharing weight, when not 0, must be above 1n: smaller ones collapse to 0 in its share arithmetic.
MIN_WEIGHT = Decimal("1e-9")


def _limit_problem(path: str, value: Any) -> Optional[str]:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return "%s=%r; allowed: a whole number of GPUs, 0 or more" % (path, value)
    return None


def teams_input(settings: Mapping[str, Any]) -> str:
    """The input a problem of a team names: tenancy_teams where gpu_queues_teams is its value (the role's default,
    so that is what the user wrote), else gpu_queues_teams."""
    tenancy = settings.get("tenancy_teams")
    return "tenancy_teams" if tenancy is not None and tenancy == settings.get("gpu_queues_teams") else "gpu_queues_teams"


def _weight_problem(path: str, weight: Any) -> Optional[str]:
    quantity = parse_quantity(str(weight)) if not isinstance(weight, bool) else None
    if quantity is None or quantity < 0 or 0 < quantity <= MIN_WEIGHT:
        return ("%s=%r; allowed: 0, or a number above 0.000000001 (the team's fair-sharing weight; Kueue refuses "
                "smaller ones but 0)" % (path, weight))
    return None


def _gpu_resources_problems(resources: Any) -> List[str]:
    """The GPU resources become every ClusterQueue's coveredResources (after cpu and memory)."""
    if not isinstance(resources, list) or not resources or not all(
            isinstance(name, str) and name.startswith("nvidia.com/") for name in resources):
        return ["gpu_queues_gpu_resources=%r; allowed: a non-empty list of nvidia.com/ resource names such as "
                "nvidia.com/gpu" % (resources,)]
    problems = ["gpu_queues_gpu_resources[%d]=%r is not a resource name; allowed: %s" % (index, name, LABEL_KEY_ALLOWED)
                for index, name in enumerate(resources) if not is_label_key(name)]
    problems.extend("gpu_queues_gpu_resources[%d]=%r is listed twice; allowed: each resource once (Kueue refuses a "
                    "resource covered twice)" % (index, name)
                    for index, name in enumerate(resources) if name in resources[:index])
    if len(resources) > MAX_GPU_RESOURCES:
        problems.append("gpu_queues_gpu_resources has %d resources; allowed: at most %d (a ClusterQueue covers at most "
                        "64 resources, cpu and memory among them)" % (len(resources), MAX_GPU_RESOURCES))
    return problems


def queue_quota_problems(where: str, team: Mapping[str, Any], gpu_resources: List[str], has_cohort: bool) -> List[str]:
    """What Kueue's ClusterQueue webhook would refuse in the queue gpu_queues_objects renders for one present team
    whose inputs have their form (`where` names the team as the user wrote it: tenancy_teams[1]), refused here before
    the role changes anything, where Kueue would refuse it only after Kueue, its webhooks, the flavors and the cohort
    are applied (issue 35). The one home of these rules; tests/unit/test_kueue_oracle.py holds them to Kueue's own
    validation (lab/go/kueue-validate).

    Kueue v0.17.0, sigs.k8s.io/kueue pkg/webhooks/clusterqueue_webhook.go (ValidateClusterQueue, lines 91-113, which
    the webhook runs on create and update), and how the role's inputs reach each check:

    - validateFlavorQuotas/validateLendingLimit (lines 216-241, 267-274): a resource's lendingLimit must be at most
      its nominalQuota. The role puts queue.lending_limit on every GPU resource of gpu_queues_gpu_resources, whose
      nominalQuota is gpus[<resource>] (0 where the team has none): the limit may be at most the smallest of those.
    - validateLimit (lines 252-265; the CRD's CEL rule says the same of borrowingLimit): borrowingLimit and
      lendingLimit must be unset while cohortName is empty. cohortName is gpu_queues_cohort (a DNS label, so never
      empty once its form passes; checked here all the same: has_cohort).
    - validateResourceQuantity (lines 243-250): nominalQuota, borrowingLimit and lendingLimit not negative: gpus, the
      limits (whole numbers, 0 or more: the form checks of gpu_queues_problems) and the team's cpu and memory
      (checked here; the defaults are input_form_problems' quantities).
    - validateFairSharing (common.go lines 42-60): a weight not negative and, when not 0, above 1n (the form check
      of queue.weight).
    - validateResourceName and the duplicate check of validateResourceGroups (common.go lines 29-35,
      clusterqueue_webhook.go lines 187-214): coveredResources are label keys, each once: gpu_queues_gpu_resources
      (_gpu_resources_problems). The limits of 256 flavors and resources (lines 119-161) cannot be reached: one
      flavor per queue, and the CRD's 64 covered resources come first.
    - Not reachable from the inputs: resources named in coveredResources' order, the namespace selector (the team's
      name, a DNS label), preemption and flavor fungibility (fixed by the role).
    """
    problems: List[str] = []
    for key in ("cpu", "memory"):
        if key in team:
            problem = quantity_problem("%s.%s" % (where, key), team[key])
            if problem:
                problems.append(problem + " (the team's nominal quota of %s in its ClusterQueue)" % key)
    queue = team.get("queue") or {}
    limits = [key for key in ("borrowing_limit", "lending_limit") if queue.get(key) is not None]
    if not has_cohort:
        problems.extend("%s.queue.%s=%r is set while gpu_queues_cohort is empty; allowed: no borrowing or lending "
                        "limit without a cohort (Kueue refuses a ClusterQueue's limits outside a cohort)"
                        % (where, key, queue[key]) for key in limits)
    lend = queue.get("lending_limit")
    if lend is None:
        return problems
    gpus = team.get("gpus") or {}
    nominal = {name: int(gpus.get(name, 0)) for name in gpu_resources}
    over = [name for name in gpu_resources if lend > nominal[name]]
    if over:
        quotas = ", ".join("%s.gpus[%r]=%d" % (where, name, nominal[name]) if name in gpus
                           else "%s.gpus has no %r (0)" % (where, name) for name in over)
        problems.append("%s.queue.lending_limit=%r is more than the team's nominal quota (%s); allowed: 0 to %d, the "
                        "smallest quota of the team's GPU resources (the limit applies to each of "
                        "gpu_queues_gpu_resources; Kueue refuses a lendingLimit above the nominalQuota: a team cannot "
                        "lend more GPUs than it has)" % (where, lend, quotas, min(nominal.values())))
    return problems


def gpu_queues_problems(settings: Mapping[str, Any]) -> List[str]:
    """Every problem of the role's flavors, teams and quotas ({input name: value}; gpu_queues_cohort and tenancy_teams
    optional), each naming the input and the key path inside it, the value and what is allowed. Quantities and names
    of single inputs are input_form_problems'. A team's problems name tenancy_teams when the role's teams are that
    input (teams_input); a present team whose inputs have their form is then held to what Kueue's ClusterQueue
    webhook would refuse in its queue (queue_quota_problems)."""
    problems: List[str] = []
    flavors = settings.get("gpu_queues_flavors")
    names: List[str] = []
    if not isinstance(flavors, list) or not flavors:
        problems.append("gpu_queues_flavors=%r; allowed: a non-empty list of {name, node_labels}" % (flavors,))
        flavors = []
    for index, flavor in enumerate(flavors):
        where = "gpu_queues_flavors[%d]" % index
        if not isinstance(flavor, Mapping) or set(flavor) - {"name", "node_labels", "tolerations"}:
            problems.append("%s=%r; allowed: {name: <DNS label>, node_labels: {<label key>: <value>}, tolerations: "
                            "[<toleration>]}" % (where, flavor))
            continue
        tolerations = flavor.get("tolerations", [])
        if not isinstance(tolerations, list):
            problems.append("%s.tolerations=%r; allowed: a list of tolerations" % (where, tolerations))
            tolerations = []
        for position, toleration in enumerate(tolerations):
            if (not isinstance(toleration, Mapping) or set(toleration) - TOLERATION_KEYS
                    or toleration.get("operator", "Equal") not in ("Equal", "Exists")
                    or toleration.get("effect", "NoSchedule") not in ("NoSchedule", "PreferNoSchedule", "NoExecute")
                    or ("key" in toleration and not is_label_key(toleration["key"]))):
                problems.append("%s.tolerations[%d]=%r; allowed: {key: <label key>, operator: Equal|Exists, value: "
                                "<string>, effect: NoSchedule|PreferNoSchedule|NoExecute}" % (where, position, toleration))
        if not is_dns_label(flavor.get("name")):
            problems.append("%s.name=%r; allowed: a DNS label (lower-case letters, digits and '-')" % (where, flavor.get("name")))
        elif flavor["name"] in names:
            problems.append("%s.name=%r is listed twice" % (where, flavor["name"]))
        names.append(flavor.get("name"))
        labels = flavor.get("node_labels", {})
        if not isinstance(labels, Mapping):
            problems.append("%s.node_labels=%r; allowed: a mapping of node label keys to values" % (where, labels))
            continue
        for key, value in labels.items():
            if not is_label_key(key) or not isinstance(value, str) or not is_label_value(value):
                problems.append("%s.node_labels[%r]=%r; allowed: a label key and a string label value" % (where, key, value))
    resources = settings.get("gpu_queues_gpu_resources")
    resource_problems = _gpu_resources_problems(resources)
    problems.extend(resource_problems)
    teams = settings.get("gpu_queues_teams")
    if not isinstance(teams, list):
        return problems + ["gpu_queues_teams=%r; allowed: a list of teams as tenancy_teams has them" % (teams,)]
    source = teams_input(settings)
    # The cohort every queue joins (cohortName), judged where given.
    has_cohort = bool(settings["gpu_queues_cohort"]) if "gpu_queues_cohort" in settings else True
    for index, team in enumerate(teams):
        where = "%s[%d]" % (source, index)
        if not isinstance(team, Mapping) or not is_dns_label(team.get("name")):
            problems.append("%s=%r; allowed: a team with a name (a DNS label)" % (where, team))
            continue
        queue = team.get("queue", {})
        if not isinstance(queue, Mapping):
            problems.append("%s.queue=%r; allowed: a mapping with keys %s" % (where, queue, ", ".join(QUEUE_KEYS)))
            continue
        team_problems = ["%s.queue.%s is not a known key; allowed: %s" % (where, key, ", ".join(QUEUE_KEYS))
                         for key in queue if key not in QUEUE_KEYS]
        if "flavor" in queue and queue["flavor"] not in names:
            team_problems.append("%s.queue.flavor=%r is not a flavor of gpu_queues_flavors; allowed: %s"
                                 % (where, queue["flavor"], ", ".join(str(name) for name in names)))
        for key in ("borrowing_limit", "lending_limit"):
            if key in queue and queue[key] is not None:
                problem = _limit_problem("%s.queue.%s" % (where, key), queue[key])
                if problem:
                    team_problems.append(problem)
        problem = _weight_problem("%s.queue.weight" % where, queue.get("weight", 1))
        if problem:
            team_problems.append(problem)
        gpus = team.get("gpus", {})
        if not isinstance(gpus, Mapping):
            problems.extend(team_problems + ["%s.gpus=%r; allowed: a mapping of GPU resource names to counts" % (where, gpus)])
            continue
        for name, count in gpus.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                team_problems.append("%s.gpus[%r]=%r; allowed: a whole number of GPUs, 0 or more" % (where, name, count))
        problems.extend(team_problems)
        if not team_problems and not resource_problems and team.get("state", "present") == "present":
            problems.extend(queue_quota_problems(where, team, resources, has_cohort))
    return problems


def gpu_queues_flavors_from_labels(node_labels: Mapping[str, Mapping[str, Any]], label: str) -> List[Dict[str, Any]]:
    """A ResourceFlavor per distinct value of `label` among the GPU nodes' labels ({node: labels}, as gpu_scheduling
    sets them: nvidia.com/gpu.product from the facts, or the pool), named after the value (NVIDIA-H100-80GB-HBM3 ->
    nvidia-h100-80gb-hbm3); one flavor `gpu` for every node when no node has the label yet."""
    values = sorted({str(labels[label]) for labels in node_labels.values() if labels.get(label) not in (None, "")})
    flavors = []
    for value in values:
        name = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")[:63].strip("-") or "gpu"
        flavors.append({"name": name, "node_labels": {label: value}})
    return flavors or [{"name": "gpu", "node_labels": {}}]


def _present(teams: List[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    return [team for team in teams if team.get("state", "present") == "present"]


def team_flavor(team: Mapping[str, Any], flavors: List[Mapping[str, Any]], pool_label: str) -> str:
    """The flavor of a team's quota: its queue.flavor, else the flavor that selects its node_pool (the value of
    pool_label), else the first flavor."""
    queue = team.get("queue") or {}
    if queue.get("flavor"):
        return queue["flavor"]
    pool = team.get("node_pool")
    for flavor in flavors:
        if pool and (flavor.get("node_labels") or {}).get(pool_label) == pool:
            return flavor["name"]
    return flavors[0]["name"]


def _covered(team: Mapping[str, Any], gpu_resources: List[str], defaults: Mapping[str, Any]) -> Dict[str, Any]:
    quota: Dict[str, Any] = {"cpu": str(team.get("cpu", defaults.get("cpu"))),
                             "memory": str(team.get("memory", defaults.get("memory")))}
    for name in gpu_resources:
        # Quantities as strings, as Kueue's webhook stores them at creation: an int would differ on every re-apply.
        quota[name] = str(int((team.get("gpus") or {}).get(name, 0)))
    return quota


def gpu_queues_capacity_problems(teams: List[Mapping[str, Any]], flavors: List[Mapping[str, Any]],
                                 nodes: List[Mapping[str, Any]], gpu_resources: List[str], pool_label: str,
                                 tenancy_teams: Optional[List[Mapping[str, Any]]] = None) -> List[str]:
    """A team whose nominal GPU quota is more than every node of its flavor together can give (allocatable) could
    never use it: refused, naming the team as the user wrote it (tenancy_teams[i] when the teams are tenancy_teams,
    as by default), the flavor, the quota and what the flavor's nodes have."""
    source = teams_input({"tenancy_teams": tenancy_teams, "gpu_queues_teams": teams})
    problems = []
    for index, team in enumerate(teams):
        if team.get("state", "present") != "present":
            continue
        name = team_flavor(team, flavors, pool_label)
        flavor = next((f for f in flavors if f["name"] == name), None)
        if flavor is None:
            continue
        selector = flavor.get("node_labels") or {}
        matching = [node for node in nodes
                    if all(((node.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in selector.items())]
        for resource in gpu_resources:
            want = int((team.get("gpus") or {}).get(resource, 0))
            have = sum(int(parse_quantity((node.get("status") or {}).get("allocatable", {}).get(resource, "0")) or 0)
                       for node in matching)
            if want > have:
                problems.append("%s[%d] (team %s): gpus[%r]=%d exceeds the cluster: the nodes of flavor %s "
                                "(%s) have %d allocatable; allowed: at most %d, or set gpu_queues_check_capacity: false "
                                "while nodes are still joining"
                                % (source, index, team["name"], resource, want, name,
                                   ", ".join("%s=%s" % kv for kv in selector.items()) or "every node", have, have))
    return problems


def gpu_queues_objects(teams: List[Mapping[str, Any]], flavors: List[Mapping[str, Any]], gpu_resources: List[str],
                       cohort: str, local_queue: str, defaults: Mapping[str, Any], pool_label: str = "",
                       fair_sharing: bool = True) -> Dict[str, List[Dict[str, Any]]]:
    """{'cluster': ResourceFlavors, the Cohort and a ClusterQueue per present team; 'local': a LocalQueue in each
    present team's namespace}. A ClusterQueue lends its idle quota to the cohort and may preempt only workloads that
    borrow (reclaimWithinCohort: Any, borrowWithinCohort: Never; within the queue by priority)."""
    cluster: List[Dict[str, Any]] = []
    for flavor in flavors:
        cluster.append({"apiVersion": API, "kind": "ResourceFlavor",
                        "metadata": {"name": flavor["name"], "labels": dict(MANAGED_LABELS)},
                        "spec": {"nodeLabels": dict(flavor.get("node_labels") or {}),
                                 **({"tolerations": list(flavor["tolerations"])} if flavor.get("tolerations") else {})}})
    cluster.append({"apiVersion": API, "kind": "Cohort", "metadata": {"name": cohort, "labels": dict(MANAGED_LABELS)},
                    "spec": {}})
    local: List[Dict[str, Any]] = []
    covered = ["cpu", "memory", *gpu_resources]
    for team in _present(teams):
        queue = team.get("queue") or {}
        quota = _covered(team, gpu_resources, defaults)
        resources = []
        for name in covered:
            entry: Dict[str, Any] = {"name": name, "nominalQuota": quota[name]}
            if name in gpu_resources:
                for key, field in (("borrowing_limit", "borrowingLimit"), ("lending_limit", "lendingLimit")):
                    if queue.get(key) is not None:
                        entry[field] = str(int(queue[key]))
            resources.append(entry)
        spec: Dict[str, Any] = {
            "cohortName": cohort,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": team["name"]}},
            "queueingStrategy": "BestEffortFIFO",
            "preemption": {"reclaimWithinCohort": "Any", "borrowWithinCohort": {"policy": "Never"},
                           "withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{"coveredResources": covered,
                                "flavors": [{"name": team_flavor(team, flavors, pool_label), "resources": resources}]}],
        }
        if fair_sharing:
            spec["fairSharing"] = {"weight": str(queue.get("weight", 1))}
        cluster.append({"apiVersion": API, "kind": "ClusterQueue",
                        "metadata": {"name": team["name"], "labels": dict(MANAGED_LABELS)}, "spec": spec})
        local.append({"apiVersion": API, "kind": "LocalQueue",
                      "metadata": {"name": local_queue, "namespace": team["name"], "labels": dict(MANAGED_LABELS)},
                      "spec": {"clusterQueue": team["name"]}})
    return {"cluster": cluster, "local": local}


def gpu_queues_kueue_crds(documents: List[Any], namespace: str, service: str, version: str) -> List[Dict[str, Any]]:
    """Kueue's CRDs as its release installs them: the versions it converts call its webhook Service in the role's
    namespace; each CRD carries the Kueue version so a re-run reads one label instead of sending the CRDs again."""
    crds = []
    for document in documents:
        if not document:
            continue
        crd = dict(document)
        metadata = dict(crd.get("metadata") or {})
        metadata["labels"] = {**(metadata.get("labels") or {}), **MANAGED_LABELS, CRD_VERSION_LABEL: version}
        crd["metadata"] = metadata
        if metadata.get("name") in CONVERTED_CRDS:
            crd["spec"] = {**crd["spec"], "conversion": {"strategy": "Webhook", "webhook": {
                "clientConfig": {"service": {"namespace": namespace, "name": service, "path": "/convert"}},
                "conversionReviewVersions": ["v1"]}}}
        crds.append(crd)
    return crds


def gpu_queues_namespace_problems(teams: List[Mapping[str, Any]], namespaces: List[str],
                                  tenancy_teams: Optional[List[Mapping[str, Any]]] = None) -> List[str]:
    """A present team whose namespace does not exist cannot get its LocalQueue: one message per team, naming it as the
    user wrote it (tenancy_teams[i] when the teams are tenancy_teams, as by default)."""
    source = teams_input({"tenancy_teams": tenancy_teams, "gpu_queues_teams": teams})
    return ["%s[%d] (team %s): the namespace %s does not exist; allowed: a team whose namespace exists "
            "(the tenancy role creates it: run it first)" % (source, index, team["name"], team["name"])
            for index, team in enumerate(teams)
            if team.get("state", "present") == "present" and team["name"] not in namespaces]


def gpu_queues_crds_outdated(crds: List[Mapping[str, Any]], names: List[str], version: str) -> List[str]:
    """The names of the release's CRDs that the cluster (crds, as k8s_info lists them) lacks or has from another
    Kueue version than the role's: the CRDs are sent only when this is not empty."""
    have = {crd["metadata"]["name"]: ((crd["metadata"].get("labels") or {}).get(CRD_VERSION_LABEL)) for crd in crds}
    return [name for name in names if have.get(name) != version]


def gpu_queues_unlisted(existing: List[Mapping[str, Any]], teams: List[Mapping[str, Any]]) -> List[str]:
    """Names of the role's ClusterQueues that no present team lists any more: kept (never deleted), reported."""
    present = {team["name"] for team in _present(teams)}
    return sorted(item["metadata"]["name"] for item in existing if item["metadata"]["name"] not in present)


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"gpu_queues_problems": gpu_queues_problems, "gpu_queues_capacity_problems": gpu_queues_capacity_problems,
                "gpu_queues_objects": gpu_queues_objects, "gpu_queues_kueue_crds": gpu_queues_kueue_crds,
                "gpu_queues_unlisted": gpu_queues_unlisted,
                "gpu_queues_namespace_problems": gpu_queues_namespace_problems,
                "gpu_queues_crds_outdated": gpu_queues_crds_outdated,
                "gpu_queues_flavors_from_labels": gpu_queues_flavors_from_labels}
