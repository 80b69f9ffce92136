"""roles/gpu_queues' filters: the checks of flavors, teams and quotas, the Kueue objects built from the tenancy data,
and Kueue's CRDs as the role applies them (read from the file the role carries)."""

from __future__ import annotations

from pathlib import Path

import yaml

from conftest import load_filter_plugin

filters = load_filter_plugin("gpu_queues")
ROOT = Path(__file__).resolve().parents[2]
GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
FLAVORS = [{"name": "h100", "node_labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, "tolerations": [GPU_TAINT]},
           {"name": "a100", "node_labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}}]
TEAMS = [{"name": "vision", "gpus": {"nvidia.com/gpu": 12}, "cpu": "64", "memory": "256Gi"},
         {"name": "nlp", "gpus": {"nvidia.com/gpu": 4}, "node_pool": "NVIDIA-A100-SXM4-40GB",
          "queue": {"borrowing_limit": 2, "lending_limit": 0, "weight": 2}},
         {"name": "gone", "state": "absent", "gpus": {"nvidia.com/gpu": 8}}]


def settings(**changes):
    base = {"gpu_queues_flavors": FLAVORS, "gpu_queues_gpu_resources": ["nvidia.com/gpu"], "gpu_queues_teams": TEAMS}
    base.update(changes)
    return base


def node(name, product, gpus):
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "96"}}}


def test_valid_settings_have_no_problem():
    assert filters.gpu_queues_problems(settings()) == []


def test_each_problem_names_the_path_the_value_and_what_is_allowed():
    teams = [{"name": "vision", "gpus": {"nvidia.com/gpu": -1}, "queue": {"flavor": "v100", "burst": 1, "weight": "x"}},
             {"name": "Bad_Name"}]
    flavors = [{"name": "h100", "tolerations": [{"key": "nvidia.com/gpu", "operator": "Sometimes"}]},
               {"name": "h100", "node_labels": {"bad key!": "x"}}]
    problems = filters.gpu_queues_problems(settings(gpu_queues_teams=teams, gpu_queues_flavors=flavors,
                                                    gpu_queues_gpu_resources=["cpu"]))
    text = "\n".join(problems)
    assert "gpu_queues_teams[0].queue.flavor='v100' is not a flavor of gpu_queues_flavors; allowed: h100, h100" in text
    assert "gpu_queues_teams[0].queue.burst is not a known key" in text
    assert "gpu_queues_teams[0].queue.weight='x'" in text
    assert "gpu_queues_teams[0].gpus['nvidia.com/gpu']=-1" in text
    assert "gpu_queues_teams[1]=" in text
    assert "gpu_queues_flavors[1].name='h100' is listed twice" in text
    assert "gpu_queues_flavors[1].node_labels['bad key!']" in text
    assert "gpu_queues_gpu_resources=['cpu']" in text
    assert "gpu_queues_flavors[0].tolerations[0]={'key': 'nvidia.com/gpu', 'operator': 'Sometimes'}; allowed:" in text
    assert len(problems) == 9


def test_a_team_quota_over_its_flavors_nodes_is_refused_with_both_figures():
    nodes = [node("h-0", "NVIDIA-H100-80GB-HBM3", 8), node("a-0", "NVIDIA-A100-SXM4-40GB", 4)]
    problems = filters.gpu_queues_capacity_problems(TEAMS, FLAVORS, nodes, ["nvidia.com/gpu"], "nvidia.com/gpu.product")
    # vision wants 12 in h100 (8 there); nlp's 4 fit a100; the absent team is not checked.
    assert problems == [
        "gpu_queues_teams[0] (team vision): gpus['nvidia.com/gpu']=12 exceeds the cluster: the nodes of flavor h100 "
        "(nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3) have 8 allocatable; allowed: at most 8, or set "
        "gpu_queues_check_capacity: false while nodes are still joining"]
    assert filters.gpu_queues_capacity_problems(TEAMS, FLAVORS, nodes + [node("h-1", "NVIDIA-H100-80GB-HBM3", 8)],
                                                ["nvidia.com/gpu"], "nvidia.com/gpu.product") == []


def test_queues_lend_idle_quota_in_one_cohort_and_preempt_only_borrowers():
    objects = filters.gpu_queues_objects(TEAMS, FLAVORS, ["nvidia.com/gpu"], "gpu-teams", "gpu",
                                         {"cpu": "16", "memory": "64Gi"}, "nvidia.com/gpu.product", True)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects["cluster"]]
    assert kinds == [("ResourceFlavor", "h100"), ("ResourceFlavor", "a100"), ("Cohort", "gpu-teams"),
                     ("ClusterQueue", "vision"), ("ClusterQueue", "nlp")]
    assert objects["cluster"][0]["spec"] == {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                                             "tolerations": [GPU_TAINT]}
    assert objects["cluster"][1]["spec"] == {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}}
    vision, nlp = objects["cluster"][3]["spec"], objects["cluster"][4]["spec"]
    assert vision["cohortName"] == nlp["cohortName"] == "gpu-teams"
    assert vision["preemption"] == {"reclaimWithinCohort": "Any", "borrowWithinCohort": {"policy": "Never"},
                                    "withinClusterQueue": "LowerPriority"}
    assert vision["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "vision"}}
    group = vision["resourceGroups"][0]
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu"]
    assert group["flavors"] == [{"name": "h100", "resources": [
        {"name": "cpu", "nominalQuota": "64"}, {"name": "memory", "nominalQuota": "256Gi"},
        {"name": "nvidia.com/gpu", "nominalQuota": "12"}]}]
    # nlp: the flavor of its node pool, the defaults for cpu and memory, its limits and weight.
    assert nlp["resourceGroups"][0]["flavors"] == [{"name": "a100", "resources": [
        {"name": "cpu", "nominalQuota": "16"}, {"name": "memory", "nominalQuota": "64Gi"},
        {"name": "nvidia.com/gpu", "nominalQuota": "4", "borrowingLimit": "2", "lendingLimit": "0"}]}]
    assert nlp["fairSharing"] == {"weight": "2"}
    assert [(q["metadata"]["namespace"], q["spec"]["clusterQueue"]) for q in objects["local"]] == [
        ("vision", "vision"), ("nlp", "nlp")]
    without = filters.gpu_queues_objects(TEAMS, FLAVORS, ["nvidia.com/gpu"], "gpu-teams", "gpu", {"cpu": "1", "memory": "1Gi"},
                                         "nvidia.com/gpu.product", False)
    assert "fairSharing" not in without["cluster"][3]["spec"]


def test_the_carried_crds_get_the_conversion_webhook_and_the_version_label():
    directory = ROOT / "roles/gpu_queues/files/kueue-v0.17.0"
    names = yaml.safe_load((ROOT / "roles/gpu_queues/vars/main.yml").read_text())["__gpu_queues_crd_names"]
    # The role reads kueue.x-k8s.io_<plural>.yaml for each name; the directory holds exactly those.
    files = ["%s_%s.yaml" % (name.split(".", 1)[1], name.split(".", 1)[0]) for name in names]
    assert sorted(files) == sorted(path.name for path in directory.glob("*.yaml"))
    documents = [yaml.safe_load((directory / name).read_text()) for name in files]
    crds = filters.gpu_queues_kueue_crds(documents, "queues", "kueue-webhook-service", "v0.17.0")
    assert len(crds) == 11 == len({crd["metadata"]["name"] for crd in crds})
    converted = {crd["metadata"]["name"]: crd["spec"]["conversion"] for crd in crds if "conversion" in crd["spec"]}
    assert set(converted) == set(filters.CONVERTED_CRDS)
    assert converted["workloads.kueue.x-k8s.io"]["webhook"]["clientConfig"]["service"] == {
        "namespace": "queues", "name": "kueue-webhook-service", "path": "/convert"}
    assert all(crd["metadata"]["labels"]["gpu-cluster.dev/kueue-version"] == "v0.17.0" for crd in crds)
    assert names == [crd["metadata"]["name"] for crd in crds]
    listed = [{"metadata": {"name": name, "labels": {"gpu-cluster.dev/kueue-version": "v0.17.0"}}} for name in names]
    assert filters.gpu_queues_crds_outdated(listed, names, "v0.17.0") == []
    assert filters.gpu_queues_crds_outdated(listed[1:], names, "v0.18.0") == names
    assert filters.gpu_queues_crds_outdated(listed[1:], names, "v0.17.0") == names[:1]
    # The release's storage version is the one the role's objects use.
    for crd in crds:
        assert [v["name"] for v in crd["spec"]["versions"] if v["storage"]] == ["v1beta2"]


def test_teams_no_longer_present_are_reported_and_missing_namespaces_named():
    existing = [{"metadata": {"name": name}} for name in ("vision", "nlp", "gone", "old")]
    assert filters.gpu_queues_unlisted(existing, TEAMS) == ["gone", "old"]
    assert filters.gpu_queues_namespace_problems(TEAMS, ["vision"]) == [
        "gpu_queues_teams[1] (team nlp): the namespace nlp does not exist; allowed: a team whose namespace exists "
        "(the tenancy role creates it: run it first)"]


def test_flavors_default_to_one_per_gpu_product_of_the_gpu_nodes():
    labels = {"gpu-h100-0": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
              "gpu-h100-1": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
              "gpu-a100-0": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}, "new": {}}
    flavors = filters.gpu_queues_flavors_from_labels(labels, "nvidia.com/gpu.product")
    assert flavors == [
        {"name": "nvidia-a100-sxm4-40gb", "node_labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}},
        {"name": "nvidia-h100-80gb-hbm3", "node_labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}]
    assert filters.gpu_queues_problems(settings(gpu_queues_flavors=flavors)) == []
    # A team's node_pool picks its product's flavor.
    nlp = dict(TEAMS[1], queue={})
    assert filters.team_flavor(nlp, flavors, "nvidia.com/gpu.product") == "nvidia-a100-sxm4-40gb"
    assert filters.gpu_queues_flavors_from_labels({"new": {}}, "nvidia.com/gpu.product") == [
        {"name": "gpu", "node_labels": {}}]


def test_a_lending_limit_above_the_teams_quota_is_refused_naming_the_input_the_user_wrote():
    # Issue 35: Kueue's webhook refused this queue only after Kueue, its webhooks, the flavors and the cohort were
    # applied, naming no input. The teams came from tenancy_teams (gpu_queues_teams' default): named so.
    teams = [TEAMS[0], {"name": "nlp", "gpus": {"nvidia.com/gpu": 4}, "queue": {"lending_limit": 6}}]
    problems = filters.gpu_queues_problems(settings(gpu_queues_teams=teams, tenancy_teams=teams,
                                                    gpu_queues_cohort="gpu-teams"))
    assert problems == [
        "tenancy_teams[1].queue.lending_limit=6 is more than the team's nominal quota "
        "(tenancy_teams[1].gpus['nvidia.com/gpu']=4); allowed: 0 to 4, the smallest quota of the team's GPU resources "
        "(the limit applies to each of gpu_queues_gpu_resources; Kueue refuses a lendingLimit above the nominalQuota: "
        "a team cannot lend more GPUs than it has)"]
    # Set apart from tenancy_teams, the role's own input is named; at the quota it is accepted.
    assert filters.gpu_queues_problems(settings(gpu_queues_teams=teams))[0].startswith(
        "gpu_queues_teams[1].queue.lending_limit=6 ")
    teams[1] = {**teams[1], "queue": {"lending_limit": 4}}
    assert filters.gpu_queues_problems(settings(gpu_queues_teams=teams, gpu_queues_cohort="gpu-teams")) == []


def test_the_lending_limit_applies_to_every_gpu_resource_a_team_may_have_none_of():
    teams = [{"name": "nlp", "gpus": {"nvidia.com/gpu": 4}, "queue": {"lending_limit": 2}}]
    problems = filters.gpu_queues_problems(settings(
        gpu_queues_teams=teams, gpu_queues_gpu_resources=["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]))
    assert len(problems) == 1
    assert "(gpu_queues_teams[0].gpus has no 'nvidia.com/mig-1g.10gb' (0)); allowed: 0 to 0" in problems[0]


def test_what_else_kueues_webhook_refuses_in_a_queue_is_refused_in_preflight():
    teams = [{"name": "vision", "cpu": "-2", "memory": "64Gi", "queue": {"borrowing_limit": 2, "weight": "1n"}},
             {"name": "nlp", "queue": {"lending_limit": 0}},
             {"name": "gone", "state": "absent", "cpu": "-1", "queue": {"lending_limit": 9}}]
    problems = filters.gpu_queues_problems(settings(
        gpu_queues_teams=teams, gpu_queues_cohort="",
        gpu_queues_gpu_resources=["nvidia.com/gpu", "nvidia.com/bad name", "nvidia.com/gpu"]))
    text = "\n".join(problems)
    assert "gpu_queues_gpu_resources[1]='nvidia.com/bad name' is not a resource name" in text
    assert "gpu_queues_gpu_resources[2]='nvidia.com/gpu' is listed twice" in text
    assert "gpu_queues_teams[0].queue.weight='1n'; allowed: 0, or a number above 0.000000001" in text
    assert len(problems) == 3  # the teams' queues are judged once the GPU resources and the team's forms are right

    teams[0]["queue"] = {"borrowing_limit": 2, "weight": 0}
    problems = filters.gpu_queues_problems(settings(gpu_queues_teams=teams, gpu_queues_cohort=""))
    assert problems == [
        "gpu_queues_teams[0].cpu='-2'; allowed: a quantity >= 0 (the team's nominal quota of cpu in its ClusterQueue)",
        "gpu_queues_teams[0].queue.borrowing_limit=2 is set while gpu_queues_cohort is empty; allowed: no borrowing "
        "or lending limit without a cohort (Kueue refuses a ClusterQueue's limits outside a cohort)",
        "gpu_queues_teams[1].queue.lending_limit=0 is set while gpu_queues_cohort is empty; allowed: no borrowing "
        "or lending limit without a cohort (Kueue refuses a ClusterQueue's limits outside a cohort)"]
    # The absent team renders no queue: its quota is not Kueue's business.
    assert not [problem for problem in problems if "teams[2]" in problem]
    assert len(filters.gpu_queues_problems(settings(gpu_queues_gpu_resources=[
        "nvidia.com/r%d" % index for index in range(63)]))) == 1


def test_capacity_and_namespace_refusals_name_the_teams_as_the_user_wrote_them():
    """gpu_queues_teams defaults to tenancy_teams: a user who wrote tenancy_teams must read tenancy_teams[i] (issue 35:
    messages named the derived variable); teams given to the role itself keep gpu_queues_teams[i]."""
    nodes = [node("h-0", "NVIDIA-H100-80GB-HBM3", 8), node("a-0", "NVIDIA-A100-SXM4-40GB", 4)]
    capacity = filters.gpu_queues_capacity_problems(TEAMS, FLAVORS, nodes, ["nvidia.com/gpu"], "nvidia.com/gpu.product",
                                                    tenancy_teams=TEAMS)
    assert [problem.split(" (team")[0] for problem in capacity] == ["tenancy_teams[0]"]
    namespaces = filters.gpu_queues_namespace_problems(TEAMS, ["vision"], tenancy_teams=TEAMS)
    assert [problem.split(" (team")[0] for problem in namespaces] == ["tenancy_teams[1]"]
    other = [dict(TEAMS[0])]
    assert filters.gpu_queues_namespace_problems(TEAMS, ["vision"], tenancy_teams=other)[0].startswith(
        "gpu_queues_teams[1] (team nlp)")
