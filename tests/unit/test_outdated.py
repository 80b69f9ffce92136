"""tests/outdated.py (`make outdated`) judged on answers recorded from the Go module proxy and PyPI on 2026-12-07
(tests/unit/fixtures/outdated/answers.json): what counts as newer, what as behind, and what it cannot see."""

from __future__ import annotations

import datetime as dt
import json
import urllib.error

from conftest import REPO_ROOT, load_source

outdated = load_source("outdated", REPO_ROOT / "tests" / "outdated.py")
RECORDED = json.loads((REPO_ROOT / "tests" / "unit" / "fixtures" / "outdated" / "answers.json").read_text())["answers"]
TODAY = dt.date(2026, 12, 7)
PROXY = "https://proxy.golang.org"


def fetch(url: str) -> bytes:
    if url not in RECORDED:
        raise urllib.error.HTTPError(url, 403, "Forbidden", None, None)  # what the proxy says for a refused module
    return RECORDED[url].encode("utf-8")


def test_a_line_kept_on_purpose_is_compared_with_its_own_line_and_dated_by_the_proxy():
    pin = outdated.Pin("containerd 2.2", "v2.2.9", "go:github.com/containerd/containerd/v2", line_only=True)
    row = outdated.look(pin, fetch, PROXY, TODAY)
    assert row.status == "behind: v2.2.10, released 2026-10-13 (55 days ago)"
    assert row.notes_url == "https://github.com/containerd/containerd/releases/tag/v2.2.10"
    # Without line_only the newest line is named too.
    row = outdated.look(outdated.Pin("containerd", "v2.2.9", pin.watch), fetch, PROXY, TODAY)
    assert row.status.startswith("behind: v2.2.10") and row.status.endswith("; newest v2.4.2")


def test_prometheus_is_read_in_its_modules_numbering_and_old_major_tags_do_not_count():
    listed = RECORDED[PROXY + "/github.com/prometheus/prometheus/@v/list"].split()
    assert "v1.99.0" in listed and "v0.316.0" in listed
    pin = outdated.Pin("Prometheus", "v3.16.0", "go:github.com/prometheus/prometheus",
                       go_form=outdated.to_go_form("v3.16.0"))
    assert pin.go_form == "v0.316.0" and outdated.from_go_form("v0.316.0") == "v3.16.0"
    row = outdated.look(pin, fetch, PROXY, TODAY)
    assert row.status == "current" and row.newest == "v3.16.0"


def test_the_supported_range_counts_a_newer_minor_only_and_no_pre_release():
    assert "v1.38.0-beta.0" in RECORDED[PROXY + "/k8s.io/kubernetes/@v/list"].split()
    pin = outdated.Pin("Kubernetes", "1.37.0", "go:k8s.io/kubernetes", minor_only=True)
    assert outdated.look(pin, fetch, PROXY, TODAY).status == "current"
    older = outdated.Pin("Kubernetes", "1.36.0", "go:k8s.io/kubernetes", minor_only=True)
    # v1.37.1 is the first 1.37 release the proxy lists; the newer minor is dated by it.
    assert outdated.look(older, fetch, PROXY, TODAY).status.startswith("behind: v1.37.1, released 2026-")


def test_pypi_releases_with_their_first_upload_the_pinned_line_first():
    pin = outdated.Pin("ansible-core", "2.19.14", "pypi:ansible-core")
    row = outdated.look(pin, fetch, PROXY, TODAY)
    assert row.status == "behind: 2.19.15, released 2026-11-02 (35 days ago); newest 2.22.0"
    assert row.notes_url == "https://pypi.org/project/ansible-core/2.19.15/"
    # The same answer a week earlier: under a month old, only noted.
    row = outdated.look(pin, fetch, PROXY, dt.date(2026, 11, 20))
    assert row.status.startswith("newer: 2.19.15, released 2026-11-02 (18 days ago, under a month)")


def test_what_no_registry_here_shows_says_why():
    refused = outdated.look(outdated.Pin("DCGM exporter", "4.6.0-4.8.3", "go:github.com/NVIDIA/dcgm-exporter"), fetch,
                            PROXY, TODAY)
    assert refused.status == "not visible here: the Go module proxy answers 403 for github.com/NVIDIA/dcgm-exporter"
    unwatched = outdated.look(outdated.Pin("CUDA", "12.8", "none:NVIDIA's repositories are not reachable"), fetch,
                              PROXY, TODAY)
    assert unwatched.status == "not visible here: NVIDIA's repositories are not reachable"
    assert outdated.escape_module("github.com/NVIDIA/x") == "github.com/!n!v!i!d!i!a/x"


def test_every_pin_of_versions_yml_and_the_requirements_is_looked_at():
    import yaml

    versions = yaml.safe_load((REPO_ROOT / "versions.yml").read_text())
    pins = outdated.pins(versions, [REPO_ROOT / "requirements.txt", REPO_ROOT / "requirements-scan.txt"])
    names = {pin.name for pin in pins}
    assert {c["name"] for c in versions["components"]} <= names
    assert {e["name"] for e in versions["lab"]} <= names
    assert "ansible-core (requirements.txt)" in names and "checkov (requirements-scan.txt)" in names
    for pin in pins:
        assert pin.watch.split(":", 1)[0] in ("go", "pypi", "none"), pin
    # The lab's containerd builds are lines kept on purpose.
    assert sum(pin.line_only for pin in pins) == 3
