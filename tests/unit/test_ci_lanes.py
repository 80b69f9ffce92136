"""What the Makefile's lanes promise about their files: lane 1 starts without promtool (its build is the last of a cold
run's Go builds), so no file of lane 1 may use it; lanes 2 and 3 name files that exist, each once."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = (ROOT / "Makefile").read_text()
INTEGRATION = ROOT / "tests" / "integration"


def make_list(name: str) -> list[str]:
    """A `NAME := a b \\ c` assignment of the Makefile, continuation lines joined."""
    match = re.search(rf"^{name} :=((?:.*\\\n)*.*)$", MAKEFILE, re.MULTILINE)
    assert match, f"{name} not assigned in the Makefile"
    return match.group(1).replace("\\\n", " ").split()


def lane_files() -> dict[str, list[str]]:
    lane2, lane3 = make_list("INTEGRATION_LANE2"), make_list("INTEGRATION_LANE3")
    every = sorted(str(path.relative_to(ROOT)) for path in INTEGRATION.glob("test_*.py"))
    return {"lane1": [path for path in every if path not in lane2 + lane3], "lane2": lane2, "lane3": lane3}


def test_lanes_name_existing_files_each_once():
    lanes = lane_files()
    named = lanes["lane2"] + lanes["lane3"]
    assert len(named) == len(set(named))
    assert [path for path in named if not (ROOT / path).is_file()] == []
    assert lanes["lane1"], "lane 1 holds the main job"


def test_lane_1_waits_for_prometheus_not_promtool_and_none_of_its_files_uses_promtool():
    # make's own expansion of the prerequisites (-p prints its database; -n runs no recipe)
    database = subprocess.run(["make", "-pn", "-C", str(ROOT), "test-integration"], capture_output=True, text=True,
                              check=False).stdout
    prerequisites = re.search(r"^test-integration: (.*)$", database, re.MULTILINE)
    assert prerequisites, "make printed no rule for test-integration"
    assert "prometheus" in prerequisites.group(1).split() and "promtool" not in prerequisites.group(1).split()
    users = [path for path in lane_files()["lane1"]
             if re.search(r"promtool|ensure_promtool", (ROOT / path).read_text())]
    assert users == [], f"lane 1 starts before promtool is built; move these to lane 2 or 3: {users}"
