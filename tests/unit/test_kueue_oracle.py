"""The gpu_queues role's quota rule against Kueue's own ClusterQueue validation.

The oracle is lab/go/kueue-validate: our program around sigs.k8s.io/kueue v0.17.0's pkg/webhooks.ValidateClusterQueue,
the function Kueue's validating webhook runs on every ClusterQueue create and update (`labctl kueue-validate` builds
it; `labctl oracles`, which `make unit` runs first, too). Each row of the table below is a set of the role's inputs
(teams as tenancy_teams has them, the GPU resources, the cohort); the row's ClusterQueues are rendered by the role's
own filter (gpu_queues_objects, what the apply phase sends), judged by the oracle, and the preflight rule
(gpu_queues_problems) must refuse exactly the teams whose queue Kueue refuses: a queue Kueue refuses and preflight
lets through is the failure of issue 35 (Kueue, its webhooks, the flavors and the cohort applied, then a refusal that
names no input), and a queue preflight refuses that Kueue would take is a rule of ours that has drifted from Kueue's.

Rows whose inputs preflight refuses for their form alone (a string GPU count, an unknown key) are not here: the role
cannot render them, and Kueue never sees them."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Dict, List, Mapping, Set

import pytest

from conftest import REPO_ROOT, load_filter_plugin

sys.path.insert(0, str(REPO_ROOT / "lab"))
from _common import kueue_validate_path  # noqa: E402  (lab/ on the path above)

filters = load_filter_plugin("gpu_queues")
FLAVORS = [{"name": "h100", "node_labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}]
GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.10gb"
DEFAULTS = {"cpu": "16", "memory": "64Gi"}


def team(name: str, gpus: Any = None, **keys: Any) -> Dict[str, Any]:
    return {"name": name, "gpus": {GPU: 8} if gpus is None else gpus, **keys}


# id -> (teams, role settings besides the teams). The teams' names say what Kueue must decide for each.
CASES: Dict[str, tuple] = {
    # Issue 35: the second team lends more GPUs than it has.
    "issue-35-lending-above-quota": ([team("ok-vision"), team("refused-nlp", {GPU: 4}, queue={"lending_limit": 6})], {}),
    "lending-at-quota": ([team("ok-at", {GPU: 4}, queue={"lending_limit": 4})], {}),
    "lending-zero": ([team("ok-zero", {GPU: 4}, queue={"lending_limit": 0})], {}),
    "lending-without-gpus": ([team("refused-none", {}, queue={"lending_limit": 1})], {}),
    "lending-over-a-second-resource": (
        [team("refused-mig", {GPU: 8}, queue={"lending_limit": 2}),
         team("ok-both", {GPU: 8, MIG: 4}, queue={"lending_limit": 2})], {"gpu_resources": [GPU, MIG]}),
    "borrowing-above-quota": ([team("ok-borrow", {GPU: 2}, queue={"borrowing_limit": 64})], {}),
    "limits-without-cohort": (
        [team("refused-borrow", queue={"borrowing_limit": 2}), team("refused-lend", queue={"lending_limit": 2}),
         team("ok-plain")], {"cohort": ""}),
    "negative-gpus": ([team("refused-gpus", {GPU: -1})], {}),
    "negative-limits": ([team("refused-borrow-neg", queue={"borrowing_limit": -1}),
                         team("refused-lend-neg", queue={"lending_limit": -3})], {}),
    "negative-cpu-and-memory": ([team("refused-cpu", cpu="-1"), team("refused-mem", memory="-64Gi"),
                                 team("ok-cpu", cpu="500m", memory="1.5Gi")], {}),
    # Not a quantity: the API server refuses it before the webhook (the oracle's decoding error says so).
    "cpu-not-a-quantity": ([team("refused-decode-cpu", cpu="lots"), team("ok-int-cpu", cpu=64)], {}),
    "weights": ([team("ok-w0", queue={"weight": 0}), team("ok-w2", queue={"weight": "2n"}),
                 team("ok-frac", queue={"weight": 0.5}), team("refused-w1n", queue={"weight": "1n"}),
                 team("refused-tiny", queue={"weight": 1e-10}), team("refused-neg", queue={"weight": -1})], {}),
    "duplicate-gpu-resource": ([team("refused-dup")], {"gpu_resources": [GPU, GPU]}),
    "gpu-resource-not-a-name": ([team("refused-name")], {"gpu_resources": [GPU, "nvidia.com/mig 1g"]}),
    "absent-team-renders-nothing": ([team("ok-present"), team("gone", {GPU: 1}, state="absent",
                                                                queue={"lending_limit": 9})], {}),
}


def oracle() -> str:
    path = kueue_validate_path()
    if not path.exists():
        pytest.skip(f"Kueue's validation oracle is not built at {path}: run `lab/labctl.py kueue-validate` (or "
                    "`lab/labctl.py oracles`; `make unit` does) or set KUEUE_VALIDATE")
    return str(path)


def kueue_verdicts(objects: List[Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """ClusterQueue name -> the oracle's verdict ({valid, errors, error}); other kinds are skipped by the oracle."""
    stdin = "".join(json.dumps(item) + "\n" for item in objects)
    done = subprocess.run([oracle()], input=stdin, capture_output=True, text=True, check=False, timeout=60)
    verdicts = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == (0 if all(v["valid"] for v in verdicts) else 1), done.stderr
    return {v["name"]: v for v in verdicts}


def settings(teams: List[Mapping[str, Any]], options: Mapping[str, Any]) -> Dict[str, Any]:
    return {"gpu_queues_flavors": FLAVORS, "gpu_queues_gpu_resources": options.get("gpu_resources", [GPU]),
            "gpu_queues_teams": teams, "gpu_queues_cohort": options.get("cohort", "gpu-teams")}


def refused_by_preflight(teams: List[Mapping[str, Any]], problems: List[str]) -> Set[str]:
    """The teams preflight refuses: those a problem names, or every present one when the GPU resources (which every
    queue covers) or the cohort are refused."""
    present = [t["name"] for t in teams if t.get("state", "present") == "present"]
    if any(p.startswith(("gpu_queues_gpu_resources", "gpu_queues_cohort")) for p in problems):
        return set(present)
    return {t["name"] for index, t in enumerate(teams)
            if any(p.startswith("gpu_queues_teams[%d]" % index) for p in problems)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_preflight_refuses_exactly_the_queues_kueues_webhook_refuses(case):
    teams, options = CASES[case]
    values = settings(teams, options)
    problems = filters.gpu_queues_problems(values)
    rendered = filters.gpu_queues_objects(teams, FLAVORS, values["gpu_queues_gpu_resources"], values["gpu_queues_cohort"],
                                          "gpu", DEFAULTS, "nvidia.com/gpu.product", True)
    queues = [item for item in rendered["cluster"] if item["kind"] == "ClusterQueue"]
    verdicts = kueue_verdicts(rendered["cluster"])
    assert sorted(verdicts) == sorted(q["metadata"]["name"] for q in queues)
    refused_by_kueue = {name for name, verdict in verdicts.items() if not verdict["valid"]}
    assert refused_by_preflight(teams, problems) == refused_by_kueue, (problems, verdicts)
    # The table says what Kueue decides too, so a row whose outcome changes (a new Kueue) is noticed, not just agreed.
    assert refused_by_kueue == {name for name in verdicts if name.startswith("refused-")}, verdicts
    for name in refused_by_kueue:
        # The webhook's field errors, or for the rows so named, a value the API server would not even decode.
        decoded = not name.startswith("refused-decode-")
        assert bool(verdicts[name].get("errors")) == decoded and bool(verdicts[name].get("error")) != decoded, \
            verdicts[name]


def test_the_issues_refusal_names_what_the_user_wrote_where_kueue_names_a_field_of_its_object():
    teams, options = CASES["issue-35-lending-above-quota"]
    values = dict(settings(teams, options), tenancy_teams=teams)
    problems = filters.gpu_queues_problems(values)
    assert len(problems) == 1 and problems[0].startswith(
        "tenancy_teams[1].queue.lending_limit=6 is more than the team's nominal quota "
        "(tenancy_teams[1].gpus['nvidia.com/gpu']=4); allowed: 0 to 4"), problems
    rendered = filters.gpu_queues_objects(teams, FLAVORS, [GPU], "gpu-teams", "gpu", DEFAULTS, "", True)
    verdict = kueue_verdicts(rendered["cluster"])["refused-nlp"]
    assert [(e["field"], e["value"], e["detail"]) for e in verdict["errors"]] == [
        ("spec.resourceGroups[0].flavors[0].resources[2].lendingLimit", "6",
         "must be less than or equal to the nominalQuota")]


def test_the_example_and_lab_inventories_teams_render_queues_kueue_accepts():
    import yaml

    for inventory in ("lab", "example"):
        data = yaml.safe_load((REPO_ROOT / "inventories" / inventory / "group_vars" / "cluster_control" /
                               "tenancy.yml").read_text(encoding="utf-8")) or {}
        teams = data.get("tenancy_teams") or [team("vision", {GPU: 8, MIG: 4}, cpu="64", memory="256Gi")]
        values = settings(teams, {})
        assert filters.gpu_queues_problems(values) == [], inventory
        rendered = filters.gpu_queues_objects(teams, FLAVORS, [GPU], "gpu-teams", "gpu", DEFAULTS, "", True)
        verdicts = kueue_verdicts(rendered["cluster"])
        assert verdicts and all(v["valid"] for v in verdicts.values()), (inventory, verdicts)
