"""plugins/filter/tenancy.py: the tenancy role's preflight checks and the quota and ownership data it derives."""

from __future__ import annotations

import pytest

from conftest import load_filter_plugin

tenancy = load_filter_plugin("tenancy")
problems = tenancy.tenancy_team_problems
RESERVED = ["default", "nvidia-device-plugin", "gpu-monitoring", "monitoring"]


def test_a_full_valid_team_list_has_no_problem():
    teams = [
        {"name": "vision", "state": "present", "force": False,
         "members": {"users": ["alice"], "groups": ["vision-devs"]}, "viewers": {"users": ["victor"]},
         "gpus": {"nvidia.com/gpu": 8, "nvidia.com/gpu.shared": 16, "nvidia.com/mig-1g.10gb": 4,
                  "nvidia.com/mig-3g.40gb": 0, "nvidia.com/mig-1g.10gb.me": 1},
         "cpu": "64", "memory": "256Gi", "storage": "1Ti", "node_pool": "NVIDIA-H100-80GB-HBM3"},
        {"name": "nlp-2", "cpu": 8, "memory": "1.5Ti", "storage": "2e12"},
        # A member of two teams is allowed: RBAC is per namespace and adds up.
        {"name": "speech", "members": {"users": ["alice"]}, "state": "absent", "force": True},
    ]
    assert problems(teams, RESERVED) == []
    assert problems([], RESERVED) == []


@pytest.mark.parametrize(("team", "expected"), [
    ({"name": "Vision"}, "tenancy_teams[0].name='Vision'; allowed: a DNS-1123 label"),
    ({"name": "a_b"}, "name='a_b'; allowed: a DNS-1123 label"),
    ({"name": "-x"}, "name='-x'; allowed"),
    ({"name": "x" * 64}, "allowed: a DNS-1123 label"),
    ({"name": 7}, "name=7; allowed"),
    ({}, "name=None; allowed"),
    ({"name": "kube-team"}, "name='kube-team' is a system namespace"),
    ({"name": "gpu-monitoring"}, "name='gpu-monitoring' is a system namespace"),
    ({"name": "a", "gpus": {"nvidia.com/gpu": -1}}, "gpus['nvidia.com/gpu']=-1; allowed: a whole number of devices >= 0"),
    ({"name": "a", "gpus": {"nvidia.com/gpu": "2"}}, "gpus['nvidia.com/gpu']='2'; allowed: a whole number"),
    ({"name": "a", "gpus": {"nvidia.com/gpu": True}}, "gpus['nvidia.com/gpu']=True; allowed"),
    ({"name": "a", "gpus": {"amd.com/gpu": 1}}, "gpus key 'amd.com/gpu' is not a GPU resource; allowed: nvidia.com/gpu"),
    ({"name": "a", "gpus": {"nvidia.com/mig-9g.10gb": 1}}, "gpus key 'nvidia.com/mig-9g.10gb' is not a GPU resource"),
    ({"name": "a", "gpus": {"requests.nvidia.com/gpu": 1}}, "gpus key 'requests.nvidia.com/gpu' is not"),
    ({"name": "a", "gpus": [1]}, "gpus=[1]; allowed: a mapping"),
    ({"name": "a", "cpu": "-2"}, "tenancy_teams[0].cpu='-2'; allowed: a quantity >= 0"),
    ({"name": "a", "memory": "lots"}, "memory='lots'; allowed: a Kubernetes quantity such as 8, 500m, 1.5Gi or 64Gi"),
    ({"name": "a", "memory": "64GB"}, "memory='64GB'; allowed: a Kubernetes quantity"),
    ({"name": "a", "storage": True}, "storage=True; allowed: a Kubernetes quantity"),
    ({"name": "a", "state": "gone"}, "state='gone'; allowed: present, absent"),
    ({"name": "a", "force": "yes"}, "force='yes'; allowed: true or false"),
    ({"name": "a", "quota": {}}, "tenancy_teams[0].quota is not a known key; allowed: name, state"),
    ({"name": "a", "members": ["alice"]}, "members=['alice']; allowed: a mapping {users: [..], groups: [..]}"),
    ({"name": "a", "members": {"user": ["alice"]}}, "members.user is not a known key; allowed: users, groups"),
    ({"name": "a", "viewers": {"groups": "ops"}}, "viewers.groups='ops'; allowed: a list of non-empty group names"),
    ({"name": "a", "members": {"users": ["alice"]}, "viewers": {"users": ["alice"]}},
     "tenancy_teams[0]: user 'alice' both member and viewer of team 'a'; allowed: one role per team"),
    ({"name": "a", "node_pool": "H100 nodes"}, "node_pool='H100 nodes'; allowed: a label value"),
])
def test_each_bad_input_is_named_with_its_value_and_what_is_allowed(team, expected):
    found = problems([team], RESERVED)
    assert any(expected in problem for problem in found), found


def test_duplicates_and_a_non_list():
    assert problems([{"name": "a"}, {"name": "b"}, {"name": "a"}], RESERVED) == [
        "tenancy_teams[2].name='a' repeats tenancy_teams[0]; allowed: each team once"]
    assert problems({"name": "a"}, RESERVED)[0].startswith("tenancy_teams={'name': 'a'}; allowed: a list")
    assert problems(["a"], RESERVED) == ["tenancy_teams[0]='a'; allowed: a mapping with at least a name"]


def test_gpu_quota_covers_every_known_resource_with_zero_by_default():
    known = ["nvidia.com/gpu", "nvidia.com/gpu.shared"]
    assert tenancy.tenancy_gpu_quota({"nvidia.com/gpu": 4, "nvidia.com/mig-1g.10gb": 2}, known) == {
        "requests.nvidia.com/gpu": "4", "requests.nvidia.com/gpu.shared": "0", "requests.nvidia.com/mig-1g.10gb": "2"}
    assert tenancy.tenancy_gpu_quota(None, known) == {"requests.nvidia.com/gpu": "0",
                                                      "requests.nvidia.com/gpu.shared": "0"}
    assert tenancy.tenancy_gpu_resource_problems(["nvidia.com/gpu", "gpu"]) == [
        "tenancy_gpu_resources[1]='gpu'; allowed: " + tenancy.GPU_RESOURCES_ALLOWED]


def test_only_namespaces_labelled_as_their_own_team_are_managed():
    def ns(name, **labels):
        return {"metadata": {"name": name, "labels": labels}}

    namespaces = [ns("vision", **{"app.kubernetes.io/managed-by": "gpu-cluster", "gpu-cluster.dev/team": "vision"}),
                  ns("copy", **{"app.kubernetes.io/managed-by": "gpu-cluster", "gpu-cluster.dev/team": "vision"}),
                  ns("gpu-monitoring", **{"app.kubernetes.io/managed-by": "gpu-cluster"}),
                  ns("other", **{"gpu-cluster.dev/team": "other"}), {"metadata": {"name": "bare", "labels": None}}]
    assert tenancy.tenancy_managed_namespaces(namespaces, "gpu-cluster", "gpu-cluster.dev/team") == ["vision"]


def test_deletion_with_claims_is_refused_unless_forced():
    claim = {"metadata": {"name": "datasets"}}
    lookups = [{"tenancy_absent": {"name": "a"}, "resources": [claim]},
               {"tenancy_absent": {"name": "b", "force": True}, "resources": [claim]},
               {"tenancy_absent": {"name": "c", "force": False}, "resources": []}]
    assert tenancy.tenancy_refused_deletions(lookups) == [
        "tenancy_teams entry 'a' has state=absent and force=False, but its namespace holds persistent volume claims "
        "datasets; allowed: delete or move the data first, or force: true to delete them with the namespace"]


def test_quota_defaults_are_checked_by_name():
    assert tenancy.tenancy_quantity_problems({"tenancy_default_cpu": "16", "tenancy_default_memory": "-1Gi",
                                              "tenancy_default_storage": "500Gi"}) == [
        "tenancy_default_memory='-1Gi'; allowed: a quantity >= 0"]


def test_teams_split_by_state_keep_their_order():
    teams = [{"name": "a", "state": "absent"}, {"name": "b"}, {"name": "c", "state": "present"}]
    assert [t["name"] for t in tenancy.tenancy_teams_in_state(teams, "present")] == ["b", "c"]
    assert [t["name"] for t in tenancy.tenancy_teams_in_state(teams, "absent")] == ["a"]


def test_a_trailing_newline_is_not_part_of_a_valid_name():
    """A YAML block scalar leaves a newline that `$` would accept: the API server would then refuse the namespace
    after other objects were applied."""
    found = problems([{"name": "vision\n"}], RESERVED)
    assert len(found) == 1 and found[0].startswith("tenancy_teams[0].name='vision\\n'; allowed: a DNS-1123 label"), found


def test_device_class_quota_covers_every_known_class_with_zero_by_default():
    known = ["gpu.nvidia.com", "mig.nvidia.com"]
    assert tenancy.tenancy_device_class_quota({"gpu.nvidia.com": 2, "h100.nvidia.com": 1}, known) == {
        "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "2",
        "h100.nvidia.com.deviceclass.resource.k8s.io/devices": "1",
        "mig.nvidia.com.deviceclass.resource.k8s.io/devices": "0"}
    assert tenancy.tenancy_device_class_quota(None, known) == {
        "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "0",
        "mig.nvidia.com.deviceclass.resource.k8s.io/devices": "0"}
    assert tenancy.tenancy_device_class_problems(known + ["h100.nvidia.com"]) == []


@pytest.mark.parametrize(("classes", "expected"), [
    ({"GPU": 1}, "tenancy_teams[0].device_classes key 'GPU' is not a DeviceClass name; allowed: a DeviceClass name"),
    ({"nvidia.com/gpu": 1}, "device_classes key 'nvidia.com/gpu' is not a DeviceClass name"),
    ({"a" * 226: 1}, "is not a DeviceClass name; allowed: a DeviceClass name (a DNS subdomain of at most 225"),
    ({"gpu.nvidia.com": -1}, "tenancy_teams[0].device_classes['gpu.nvidia.com']=-1; allowed: a whole number of "
     "devices >= 0"),
    ({"gpu.nvidia.com": "2"}, "device_classes['gpu.nvidia.com']='2'; allowed: a whole number"),
    (["gpu.nvidia.com"], "tenancy_teams[0].device_classes=['gpu.nvidia.com']; allowed: a mapping"),
])
def test_bad_device_classes_of_a_team_are_named(classes, expected):
    found = problems([{"name": "a", "device_classes": classes}], RESERVED)
    assert any(expected in problem for problem in found), found


def test_a_team_with_gpus_and_device_classes_is_valid():
    team = {"name": "a", "gpus": {"nvidia.com/gpu": 8}, "device_classes": {"gpu.nvidia.com": 8, "mig.nvidia.com": 4}}
    assert problems([team], RESERVED) == []


def test_the_role_wide_device_classes_are_checked():
    assert tenancy.tenancy_device_class_problems(["gpu.nvidia.com", "Bad_Class", ""]) == [
        "tenancy_gpu_device_classes[1]='Bad_Class'; allowed: " + tenancy.DEVICE_CLASSES_ALLOWED,
        "tenancy_gpu_device_classes[2]=''; allowed: " + tenancy.DEVICE_CLASSES_ALLOWED]
    [problem] = tenancy.tenancy_device_class_problems("gpu.nvidia.com")
    assert problem.startswith("tenancy_gpu_device_classes='gpu.nvidia.com'; allowed: a list")


def test_a_bad_product_class_is_named_where_the_user_wrote_it():
    """Issue 35: tenancy_gpu_device_classes takes nvidia_dra_driver_product_classes' names by default; a bad one was
    reported under the derived variable, which the user never wrote."""
    products = [{"name": "h100.nvidia.com", "product": "NVIDIA H100 80GB HBM3"}, {"name": "A100_Class", "product": "x"}]
    known = ["gpu.nvidia.com", "mig.nvidia.com", "h100.nvidia.com", "A100_Class"]
    assert tenancy.tenancy_device_class_problems(known, "tenancy_gpu_device_classes", products) == [
        "nvidia_dra_driver_product_classes[1].name='A100_Class' (in tenancy_gpu_device_classes); allowed: "
        + tenancy.DEVICE_CLASSES_ALLOWED]
