"""The one rule of who owns a repository entry that nvidia_driver and cuda_toolkit both need (module_utils/
apt_repository.py, `<role>_repository: auto|own|external`): host_probe's question, its answer on real files, the
decision from it, and both roles asking and deciding through it (rendered by Ansible's own templar)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from ansible_collections.gpu_ops.cluster.plugins.module_utils import apt_repository
from conftest import install_collection_loader, load_ansible_module, load_filter_plugin
from test_cuda_toolkit_data import resolve as cuda_resolve
from test_cuda_toolkit_data import templar as cuda_templar
from test_role_data import driver_templar, resolve as driver_resolve

probe_module = load_ansible_module("host_probe")
filters = load_filter_plugin("apt_repository")

URL = "http://gpu-lab-mirror:8080/cuda/repos/debian12/x86_64/"
OWN_KEY = "/etc/apt/keyrings/nvidia-driver.asc"
OWN_SOURCES = "/etc/apt/sources.list.d/nvidia-driver.sources"
CUDA_SOURCES = "/etc/apt/sources.list.d/cuda-toolkit.sources"
MIRROR = {"url": URL, "suites": ["/"], "components": [], "keyring": ""}
DEBIAN = {"url": "http://deb.debian.org/debian", "suites": ["bookworm"], "components": ["non-free"],
          "keyring": "/usr/share/keyrings/debian-archive-keyring.gpg"}


def probe(found: List[str] | None = None, own_exist: bool = False, differ: List[str] | None = None) -> Dict[str, Any]:
    """host_probe's answer: other files listing the URL, the role's own key and sources file and what differs."""
    answer: Dict[str, Any] = {"files": {OWN_KEY: {"exists": own_exist, "reason": ""},
                                        OWN_SOURCES: {"exists": own_exist, "reason": ""}},
                              "differ": list(differ or []), "search": {}}
    if found is not None:
        answer["search"]["repository"] = found
    return answer


def decide(answer: Dict[str, Any], mode: str = "auto", repository: Dict[str, Any] | None = None,
           package_manager: str = "apt") -> Dict[str, Any]:
    return apt_repository.plan(answer, MIRROR if repository is None else repository, mode, package_manager, OWN_KEY,
                               OWN_SOURCES, key_url=URL + "key.asc", role="nvidia_driver")


# --- the decision -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("case", "mode", "answer", "own", "used", "work"),
    [
        # No other source: the role adds its own (a fresh host: both files differ from what it writes).
        ("fresh host", "auto", probe(found=[], differ=[OWN_KEY, OWN_SOURCES]), True, [], True),
        ("own entry in place", "auto", probe(found=[], own_exist=True), True, [], False),
        # Another file lists the same URL with another keyring (cuda_toolkit's): used as it is, nothing written.
        ("cuda_toolkit's entry", "auto", probe(found=[CUDA_SOURCES], differ=[OWN_KEY, OWN_SOURCES]), False,
         [CUDA_SOURCES], False),
        # ... and where the role had written its own too (apt refuses both): only its own are removed.
        ("both entries", "auto", probe(found=[CUDA_SOURCES], own_exist=True), False, [CUDA_SOURCES], True),
        ("two other entries", "auto", probe(found=["/etc/apt/sources.list", CUDA_SOURCES]), False,
         ["/etc/apt/sources.list", CUDA_SOURCES], False),
        # own: always the role's own, whatever else lists the URL (not asked, so not known).
        ("own", "own", probe(differ=[OWN_SOURCES]), True, [], True),
        ("own in place", "own", probe(own_exist=True), True, [], False),
        # external: never, whether another file lists it or not; an own entry left from before is removed.
        ("external, someone's entry", "external", probe(found=[CUDA_SOURCES]), False, [CUDA_SOURCES], False),
        ("external, nothing yet", "external", probe(found=[]), False, [], False),
        ("external, own left over", "external", probe(found=[CUDA_SOURCES], own_exist=True), False, [CUDA_SOURCES],
         True),
    ],
)
def test_who_owns_the_entry(case, mode, answer, own, used, work):
    decision = decide(answer, mode)
    assert (decision["own"], decision["used"], decision["work"]) == (own, used, work), case
    assert decision["sources"] == ("present" if own else "absent"), case
    assert decision["key"] == ("present" if own else "absent"), case


def test_the_other_files_are_never_the_roles_to_write():
    """The plan only says what becomes of the role's own two files: another owner's file is reported, not changed."""
    decision = decide(probe(found=[CUDA_SOURCES], own_exist=True))
    assert CUDA_SOURCES not in (OWN_KEY, OWN_SOURCES)
    assert set(decision) == {"own", "used", "key", "sources", "work", "message"}
    assert decision["used"] == [CUDA_SOURCES]


def test_the_message_names_the_entry_used_and_the_setting():
    decision = decide(probe(found=[CUDA_SOURCES]))
    assert decision["message"] == (
        f"{URL} is configured in {CUDA_SOURCES}; nvidia_driver uses that entry and adds none of its own"
        " (nvidia_driver_repository=auto).")
    assert decide(probe(found=[]))["message"] == ""
    external = decide(probe(found=[]), "external")["message"]
    assert "nvidia_driver_repository=external" in external and "no other apt source" in external


@pytest.mark.parametrize("mode", ["auto", "own"])
def test_a_repository_signed_by_the_distributions_keyring_stays_the_roles_own(mode):
    """Every file signs Debian's archive with the same keyring: no conflict, so nothing is asked and auto keeps its own
    (a search answer, were there one, is ignored)."""
    assert apt_repository.search_spec(DEBIAN, mode, "apt", OWN_SOURCES) == {}
    decision = apt_repository.plan(probe(found=["/etc/apt/sources.list"]), DEBIAN, mode, "apt", OWN_KEY, OWN_SOURCES)
    assert decision["own"] and decision["used"] == [] and decision["key"] == "absent"


def test_dnf_has_no_conflict_and_keeps_its_own_unless_external():
    assert apt_repository.search_spec(MIRROR, "auto", "dnf", OWN_SOURCES) == {}
    assert decide(probe(), "auto", package_manager="dnf")["own"]
    dnf_external = decide(probe(), "external", package_manager="dnf")
    assert not dnf_external["own"] and dnf_external["sources"] == "absent" and not dnf_external["work"]
    assert "no other apt source" not in dnf_external["message"]


def test_no_repository_needed_writes_none():
    decision = decide(probe(found=[]), "auto", repository={})
    assert not decision["own"] and decision["used"] == [] and decision["message"] == ""
    assert apt_repository.search_spec({}, "auto", "apt", OWN_SOURCES) == {}


def test_an_unknown_mode_is_refused_by_the_filter():
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="'mine' is not one of auto, own, external"):
        filters.apt_repository_plan(probe(), MIRROR, "mine", "apt", OWN_KEY, OWN_SOURCES)
    with pytest.raises(AnsibleFilterError, match="apt_repository_search"):
        filters.apt_repository_search(MIRROR, "mine", "apt", OWN_SOURCES)


# --- the question, answered by host_probe on real files ----------------------------------------------------------

def search(tmp_path: Path, files: Dict[str, str], url: str = URL) -> List[str]:
    """host_probe's search_files on files written under tmp_path, asked the question the rule builds."""
    directory = tmp_path / "sources.list.d"
    directory.mkdir()
    for name, text in files.items():
        (directory / name).write_text(text)
    spec = apt_repository.search_spec({"url": url, "keyring": ""}, "auto", "apt", OWN_SOURCES)["repository"]
    assert spec["paths"] == ["/etc/apt", "/etc/apt/sources.list.d"] and spec["excludes"] == ["nvidia-driver.sources"]
    return [Path(path).name for path in probe_module.search_files(dict(spec, paths=[str(directory)]))]


CUDA_DEB822 = f"Types: deb\nURIs: {URL}\nSuites: /\nSigned-By: /etc/apt/keyrings/cuda-toolkit.asc\n"


@pytest.mark.parametrize(
    ("case", "files", "found"),
    [
        ("no other source", {"debian.sources": "URIs: http://deb.debian.org/debian\n"}, []),
        ("deb822, another keyring", {"cuda-toolkit.sources": CUDA_DEB822}, ["cuda-toolkit.sources"]),
        ("one-line entry", {"cuda.list": f"deb [signed-by=/usr/share/keyrings/cuda.gpg] {URL} /\n"}, ["cuda.list"]),
        ("without the trailing slash", {"cuda.list": f"deb {URL.rstrip('/')} /\n"}, ["cuda.list"]),
        ("with two trailing slashes", {"cuda.sources": f"URIs: {URL}/\n"}, ["cuda.sources"]),
        ("one of several URIs", {"multi.sources": f"URIs: http://other/ {URL} http://third/\n"}, ["multi.sources"]),
        ("commented out", {"cuda.list": f"# deb {URL} /\n", "cuda.sources": f"#URIs: {URL}\n"}, []),
        ("a longer path", {"cuda.list": f"deb {URL}sub/ /\n"}, []),
        ("another host", {"cuda.list": f"deb {URL.replace('gpu-lab-mirror', 'gpu-lab-mirror2')} /\n"}, []),
        ("not a sources file", {"cuda-toolkit.sources.bak": CUDA_DEB822}, []),
        ("its own file", {"nvidia-driver.sources": CUDA_DEB822}, []),
    ],
)
def test_which_files_list_the_url(tmp_path, case, files, found):
    assert search(tmp_path, files) == found, case


def test_a_url_given_without_its_trailing_slash_finds_the_entry_with_it(tmp_path):
    assert search(tmp_path, {"cuda-toolkit.sources": CUDA_DEB822}, url=URL.rstrip("/")) == ["cuda-toolkit.sources"]


def test_dots_in_the_url_are_not_wildcards(tmp_path):
    assert search(tmp_path, {"x.list": "deb http://10x0x0x5/cuda/ /\n"}, url="http://10.0.0.5/cuda/") == []


# --- both roles ask and decide through the one rule ---------------------------------------------------------------

MIRROR_INPUTS = {
    "nvidia_driver": {"nvidia_driver_source": "mirror", "nvidia_driver_mirror_url": URL,
                      "nvidia_driver_mirror_key_url": "http://gpu-lab-mirror:8080/gpu-lab-mirror.asc"},
    "cuda_toolkit": {"cuda_toolkit_source": "mirror", "cuda_toolkit_mirror_url": URL,
                     "cuda_toolkit_mirror_key_url": "http://gpu-lab-mirror:8080/gpu-lab-mirror.asc"},
}
ROLE_FILES = {
    "nvidia_driver": ("/etc/apt/keyrings/nvidia-driver.asc", OWN_SOURCES, CUDA_SOURCES),
    "cuda_toolkit": ("/etc/apt/keyrings/cuda-toolkit.asc", CUDA_SOURCES, OWN_SOURCES),
}


def role_value(role: str, name: str, **overrides: Any) -> Any:
    install_collection_loader()  # the roles call the rule as gpu_ops.cluster.* filters
    variables = dict(MIRROR_INPUTS[role], **overrides)
    if role == "nvidia_driver":
        return driver_resolve(driver_templar("Debian-12", **variables), name)
    return cuda_resolve(cuda_templar("Debian-12", **variables), name)


def role_search(role: str, mode: str) -> Dict[str, Any]:
    """The search option of the role's probe task (tasks/preflight.yml), rendered with the role's data."""
    import yaml

    tasks = yaml.safe_load((Path(__file__).resolve().parents[2] / "roles" / role / "tasks" / "preflight.yml").read_text())
    expression = next(task["gpu_ops.cluster.host_probe"]["search"] for task in tasks
                      if "gpu_ops.cluster.host_probe" in task)
    from ansible.template import trust_as_template

    install_collection_loader()
    variables = dict(MIRROR_INPUTS[role], **{f"{role}_repository": mode})
    templar = driver_templar("Debian-12", **variables) if role == "nvidia_driver" else cuda_templar("Debian-12", **variables)
    return templar.template(trust_as_template(expression))


@pytest.mark.parametrize("role", ["nvidia_driver", "cuda_toolkit"])
def test_each_role_asks_for_the_other_sources_of_its_url(role):
    _key, sources, _other = ROLE_FILES[role]
    spec = role_search(role, "auto")["repository"]
    assert spec["excludes"] == [Path(sources).name]
    assert spec["contains"] == apt_repository.url_line_pattern(URL)
    assert role_search(role, "own") == {}


@pytest.mark.parametrize("role", ["nvidia_driver", "cuda_toolkit"])
def test_each_role_uses_the_other_roles_entry_and_writes_none(role):
    key, sources, other = ROLE_FILES[role]
    answer = {"files": {key: {"exists": False}, sources: {"exists": False}}, "differ": [key, sources],
              "search": {"repository": [other]}}
    decision = role_value(role, f"__{role}_repo_plan", **{f"__{role}_probe": answer})
    assert decision["own"] is False and decision["used"] == [other]
    assert (decision["key"], decision["sources"], decision["work"]) == ("absent", "absent", False)
    assert f"{role}_repository=auto" in decision["message"]


@pytest.mark.parametrize("role", ["nvidia_driver", "cuda_toolkit"])
def test_each_role_writes_its_own_where_no_other_lists_the_url(role):
    key, sources, _other = ROLE_FILES[role]
    answer = {"files": {key: {"exists": False}, sources: {"exists": False}}, "differ": [key, sources],
              "search": {"repository": []}}
    decision = role_value(role, f"__{role}_repo_plan", **{f"__{role}_probe": answer})
    assert (decision["own"], decision["key"], decision["sources"], decision["work"]) == (True, "present", "present",
                                                                                           True)


# --- The repository's own index: does it offer the selected branch? (issue 35) --------------------------------------

INDEX = """Package: cuda-drivers
Version: 595.45.04-1

Package: cuda-drivers-580
Version: 580.95.05-1

Package: nvidia-driver-pinning-590
Version: 590.48.01-1

Package: nvidia-driver-pinning-595
Version: 595.45.04-1

Package: nvidia-open
Version: 595.45.04-1
"""


def test_a_flat_repository_has_its_index_at_its_root_and_a_suite_under_dists():
    flat = apt_repository.index_spec({"url": URL, "suites": ["/"], "components": []}, "apt", ["a"], ["b-"])
    assert flat == {"urls": [URL + "Packages.gz", URL + "Packages"], "names": ["a"], "prefixes": ["b-"]}
    suite = apt_repository.index_spec({"url": "http://m:8080/debian", "suites": ["bookworm"],
                                       "components": ["main", "non-free"]}, "apt", ["a"], architecture="aarch64")
    assert suite["urls"] == ["http://m:8080/debian/dists/bookworm/main/binary-arm64/Packages.gz",
                             "http://m:8080/debian/dists/bookworm/main/binary-arm64/Packages",
                             "http://m:8080/debian/dists/bookworm/non-free/binary-arm64/Packages.gz",
                             "http://m:8080/debian/dists/bookworm/non-free/binary-arm64/Packages"]
    assert apt_repository.index_spec({"url": URL, "suites": ["/"]}, "dnf", ["a"]) == {}
    assert apt_repository.index_spec({}, "apt", ["a"]) == {}


def test_the_index_is_read_from_the_first_url_that_answers_and_only_when_something_is_missing():
    import gzip

    from ansible_collections.gpu_ops.cluster.plugins.module_utils.host_state import read_index

    asked = []

    def fetcher(url, timeout):
        asked.append(url)
        if url.endswith(".gz"):
            raise OSError("404")
        return INDEX.encode()

    spec = {"urls": [URL + "Packages.gz", URL + "Packages"], "names": ["nvidia-driver-pinning-999", "nvidia-open"],
            "prefixes": ["nvidia-driver-pinning-", "cuda-drivers-"]}
    answer = read_index(spec, {}, 5, fetcher)
    assert answer == {"skipped": False, "url": URL + "Packages", "problem": "",
                      "names": ["cuda-drivers-580", "nvidia-driver-pinning-590", "nvidia-driver-pinning-595",
                                "nvidia-open"]}
    assert asked == [URL + "Packages.gz", URL + "Packages"]
    # Compressed, as NVIDIA's repositories serve it first.
    zipped = read_index(spec, {}, 5, lambda url, timeout: gzip.compress(INDEX.encode()))
    assert zipped["url"] == URL + "Packages.gz" and "nvidia-open" in zipped["names"]
    # Every name installed: a no-op run asks the network nothing.
    asked.clear()
    installed = {"nvidia-driver-pinning-999": [{}], "nvidia-open": [{}]}
    assert read_index(spec, installed, 5, fetcher)["skipped"] is True and asked == []
    # Nothing answers: a problem to report, never a refusal by itself.
    down = read_index(spec, {}, 5, lambda url, timeout: (_ for _ in ()).throw(OSError("Name or service not known")))
    assert down["url"] == "" and "Name or service not known" in down["problem"]


def test_a_branch_the_index_lacks_is_refused_naming_the_input_and_what_is_offered():
    index = {"skipped": False, "url": URL + "Packages.gz", "problem": "",
             "names": ["cuda-drivers-580", "nvidia-driver-pinning-590", "nvidia-driver-pinning-595", "nvidia-open"]}
    pattern = "^(?:nvidia-driver-pinning|cuda-drivers)-([0-9]+)$"
    (problem,) = apt_repository.index_problems(index, ["nvidia-driver-pinning-999", "nvidia-open"],
                                               "nvidia_driver_branch", "999", pattern)
    assert problem == ('nvidia_driver_branch="999" is not offered by the repository: its index ' + URL + "Packages.gz"
                       " has no nvidia-driver-pinning-999; offered there: 580, 590, 595.")
    assert apt_repository.index_problems(index, ["nvidia-driver-pinning-595", "nvidia-open"], "x", "595", pattern) == []
    # Not read (skipped, or the repository did not answer the host): nothing refused here.
    for unread in ({"skipped": True}, {"skipped": False, "url": "", "problem": "down"}, {}, None):
        assert apt_repository.index_problems(unread, ["nvidia-driver-pinning-999"], "x", "999", pattern) == []
    (unnamed,) = apt_repository.index_problems(index, ["cuda-drivers-999"], "nvidia_driver_branch (empty)", None)
    assert unnamed.startswith("nvidia_driver_branch (empty) is not offered") and "offered there" not in unnamed


def test_the_driver_role_asks_its_repository_for_the_branch_and_refuses_one_it_lacks():
    import yaml
    from ansible.template import trust_as_template

    tasks = yaml.safe_load((Path(__file__).resolve().parents[2] / "roles" / "nvidia_driver" / "tasks" /
                            "preflight.yml").read_text())
    expression = next(task["gpu_ops.cluster.host_probe"]["index"] for task in tasks
                      if "gpu_ops.cluster.host_probe" in task)
    install_collection_loader()
    variables = dict(MIRROR_INPUTS["nvidia_driver"], nvidia_driver_mirror_packages="cuda_repo", nvidia_driver_branch="999",
                     nvidia_driver_kernel_modules="open")
    spec = driver_templar("Debian-12", **variables).template(trust_as_template(expression))
    assert spec["urls"] == [URL + "Packages.gz", URL + "Packages"]
    assert spec["names"] == ["nvidia-driver-pinning-999", "nvidia-open"]
    answer = {"commands": {}, "paths": {}, "index": {
        "skipped": False, "url": URL + "Packages.gz", "problem": "",
        "names": ["nvidia-driver-pinning-590", "nvidia-driver-pinning-595", "nvidia-open"]}}
    facts = {"nvidia_driver": {"runfile_installed": False, "operator_driver": False, "secure_boot": "disabled",
                               "in_container": True}}
    problems = role_value("nvidia_driver", "__nvidia_driver_host_problems", nvidia_driver_mirror_packages="cuda_repo",
                          nvidia_driver_branch="999", nvidia_driver_kernel_modules="open",
                          nvidia_driver_kernel_headers="skip", __nvidia_driver_probe=answer,
                          ansible_facts=dict(facts, kernel="6.1.0-28-amd64", architecture="x86_64",
                                             os_family="Debian", distribution="Debian",
                                             distribution_major_version="12"))
    assert problems == ['nvidia_driver_branch="999" is not offered by the repository: its index ' + URL
                        + "Packages.gz has no nvidia-driver-pinning-999; offered there: 590, 595."]
    # The distribution source is judged by its catalog: its index is not asked.
    distribution = driver_templar("Debian-12", nvidia_driver_source="distribution").template(trust_as_template(expression))
    assert distribution == {}
