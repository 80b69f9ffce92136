# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Which versions work together: CUDA toolkit and driver branch, the Kubernetes range, MIG and the driver.

One table each, used by every preflight that refuses a combination that cannot work (each problem names both sides):

* CUDA_TOOLKIT_DRIVER: NVIDIA's "CUDA Toolkit and Corresponding Driver Versions" table (Linux x86_64, the GA release
  of each CUDA X.Y; CUDA_SOURCE), the driver a toolkit needs for all its features. CUDA_MAJOR_DRIVER: the same
  release notes' minor-version-compatibility minimum of each major line: below it an application of that line does
  not run at all, which is what the preflights refuse (between the two it runs, without the newer features, e.g. PTX
  JIT of a newer PTX; docs/versions.md shows both).
* KUBERNETES_MINIMUM / KUBERNETES_MAXIMUM: the minor versions the cluster roles support (versions.yml at the
  repository root is the source; tests/unit/test_versions.py keeps both equal).
* MIG_DRIVER: the first driver branch with MIG per MIG-capable product family (NVIDIA's MIG User Guide, MIG_SOURCE);
  the products themselves are module_utils/mig_profiles.py's table.
* CONTAINERD_CONFIG_VERSIONS: the containerd release line from which on it reads (and itself writes) each config
  version, its `version.ConfigVersion` (containerd's own source, CONTAINERD_SOURCE; versions.yml's `containerd` is the
  source, tests/unit/test_versions.py keeps both equal). A line reads every version up to its own, migrating older
  ones on load, and refuses a newer one.
* DRIVER_BRANCHES: each NVIDIA data-center driver branch this project knows, its kind (long-term, production, new
  feature) and the month its support ends (NVIDIA's "Supported Drivers and CUDA Toolkit Versions" table,
  DRIVER_LIFECYCLE_SOURCE; versions.yml's `nvidia_driver_branches` is the source with each entry's own source, and
  tests/unit/test_versions.py keeps both equal). driver_branch_eol_warning() is the one rule every caller uses: the
  nvidia_driver preflight, the validation report and the diagnose summary warn with its line, never refuse.

Standard library only (imported by filters, modules, the docs generator and unit tests).
"""

from __future__ import absolute_import, annotations, division, print_function

import calendar
import datetime
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.gpu_ops.cluster.plugins.module_utils import mig_profiles

CUDA_SOURCE = "https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html#cuda-driver"
MIG_SOURCE = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/index.html#supported-gpus"
CONTAINERD_SOURCE = ("containerd's own source (`github.com/containerd/containerd/v2`): `version.ConfigVersion` and "
                     "the migrations in `cmd/containerd/server/config`")

# CUDA X.Y -> the minimum Linux x86_64 driver of its GA release ("Toolkit Driver Version", >=).
CUDA_TOOLKIT_DRIVER: Mapping[str, str] = {
    "11.5": "495.29.05",
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
    # 13.1 and 13.2: NVIDIA's table as the 13.2 Update 2 release notes print it
    # (https://docs.nvidia.com/cuda/archive/13.2.2/cuda-toolkit-release-notes/index.html, Table 3). 13.3 and later are
    # left out until NVIDIA's own table is read: from 13.4 the toolkit no longer ships a driver.
    "13.1": "590.44.01",
    "13.2": "595.45.04",
}
# CUDA major -> the minimum driver with minor version compatibility for the whole line (>=).
CUDA_MAJOR_DRIVER: Mapping[str, str] = {"11": "450.80.02", "12": "525.60.13", "13": "580"}

KUBERNETES_MINIMUM = "1.33"
KUBERNETES_MAXIMUM = "1.37"

# containerd "major.minor" -> the config version it reads and writes from that line on. Version 3 (2.0) renamed the CRI
# plugins (io.containerd.grpc.v1.cri -> io.containerd.cri.v1.runtime and .images); version 4 (2.3) moved the server
# settings (grpc, ttrpc, debug, metrics) under plugins and left the CRI plugins as they were.
CONTAINERD_CONFIG_VERSIONS: Mapping[str, int] = {"1.6": 2, "2.0": 3, "2.3": 4}

# mig_profiles product key prefix -> the first driver branch with MIG on it.
# B200: R570 (>= 570.133.20), NVIDIA MIG User Guide, "Deployment Considerations".
MIG_DRIVER: Mapping[str, int] = {"a100": 450, "a30": 460, "h100 nvl": 535, "h100": 525, "h200": 550, "b200": 570}

DRIVER_LIFECYCLE_SOURCE = "https://docs.nvidia.com/datacenter/tesla/drivers/supported-drivers-and-cuda-toolkit-versions.html"
LONG_TERM, PRODUCTION, NEW_FEATURE = "long-term", "production", "new feature"
# Branch -> (kind, last month of support "YYYY-MM", or "" where no source gives one). Month precision, as NVIDIA
# publishes it: a branch is past its end from the first day after that month, so the warning never comes early.
DRIVER_BRANCHES: Mapping[int, Tuple[str, str]] = {
    470: (LONG_TERM, "2024-07"),
    535: (LONG_TERM, "2026-06"),
    550: (PRODUCTION, "2025-06"),
    570: (PRODUCTION, "2026-02"),
    580: (LONG_TERM, "2028-06"),
    590: (NEW_FEATURE, ""),
    595: (PRODUCTION, "2027-03"),
    610: (NEW_FEATURE, "2026-08"),
    615: (NEW_FEATURE, ""),
    620: (LONG_TERM, "2029-09"),
}

_CUDA = re.compile(r"^([0-9]+)\.([0-9]+)\Z")
_BRANCH = re.compile(r"^([0-9]{3,})(?:\.[0-9]+)*\Z")
_K8S = re.compile(r"^v?([0-9]+)\.([0-9]+)(?:[.+-].*)?\Z")


def _version_tuple(text: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in str(text).split("."))


def branch_of(driver: Any) -> Optional[int]:
    """The branch of "580" or "580.95.05"; None for anything else."""
    match = _BRANCH.match(str(driver).strip()) if driver not in (None, "") else None
    return int(match.group(1)) if match else None


def driver_satisfies(driver: str, minimum: str) -> bool:
    """Whether a driver, a branch ("580", taken at its newest release) or an exact version ("580.95.05"), is at least
    minimum ("580.65.06")."""
    branch, needed = branch_of(driver), branch_of(minimum)
    if branch is None or needed is None:
        return False
    if branch != needed:
        return branch > needed
    if "." not in str(driver):
        return True  # the branch's newest release: every release of the branch is at or below it
    return _version_tuple(driver) >= _version_tuple(minimum)


def cuda_driver_problems(cuda_versions: Sequence[Any], driver: Any, cuda_setting: str,
                         driver_setting: str) -> List[str]:
    """The CUDA versions the driver (branch or exact version) cannot run, each naming both settings and values."""
    if driver in (None, "") or branch_of(driver) is None:
        return []
    problems = []
    for version in cuda_versions:
        match = _CUDA.match(str(version))
        if match is None:
            continue  # the form check names it
        major_minimum = CUDA_MAJOR_DRIVER.get(match.group(1))
        full = CUDA_TOOLKIT_DRIVER.get(str(version))
        if major_minimum is None:
            problems.append("%s names CUDA %s, which this project's driver table does not know (known: %s; source %s)"
                            % (cuda_setting, version, ", ".join(CUDA_TOOLKIT_DRIVER), CUDA_SOURCE))
        elif not driver_satisfies(str(driver), major_minimum):
            problems.append(
                "%s names CUDA %s, which needs driver %s or newer (%s for all its features), but %s=%s: install "
                "a newer driver branch or an older CUDA (source %s)"
                % (cuda_setting, version, major_minimum, full or "see the table", driver_setting, driver, CUDA_SOURCE))
    return problems


def kubernetes_minor(server_version: Any) -> Optional[Tuple[int, int]]:
    """(1, 34) from "v1.34.2", "v1.34.2-eks-1234", "1.34"; None when it is not a version."""
    match = _K8S.match(str(server_version or "").strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


# The inventory variable that lets a run go on against one newer minor knowingly (docs/versions.md).
ACCEPT_UNTESTED = "gpu_cluster_kubernetes_accept_untested"


def kubernetes_version_problems(server_version: Any, minimum: str = "", need: str = "",
                                maximum: str = "", accept_untested: Any = "") -> List[str]:
    """Whether the API server's version is in the supported range (and at least a feature's own minimum).
    accept_untested: a minor above the range ("1.38") the user accepts knowingly; that minor alone passes."""
    lowest = minimum or KUBERNETES_MINIMUM
    highest = maximum or KUBERNETES_MAXIMUM
    found = kubernetes_minor(server_version)
    if found is None:
        return ["the API server reports version %r, which names no Kubernetes version; supported: %s to %s"
                % (server_version, lowest, highest)]
    if found < _version_tuple(lowest):
        return ["the API server runs Kubernetes %s; %s needs %s or newer (supported: %s to %s): upgrade the cluster"
                % (server_version, need or "this project", lowest, KUBERNETES_MINIMUM, highest)]
    if found > _version_tuple(highest):
        if accept_untested and str(accept_untested).lstrip("v") == "%d.%d" % found:
            return []
        return ["the API server runs Kubernetes %s; this project supports %s to %s, proven on the lab's %s "
                "(docs/versions.md): use a release of this collection that supports it, or set %s: \"%d.%d\" to "
                "run on it knowingly, untested" % (server_version, KUBERNETES_MINIMUM, highest, highest,
                                                   ACCEPT_UNTESTED, found[0], found[1])]
    return []


def mig_driver_branch(product_name: str) -> Optional[int]:
    """The first driver branch with MIG on a product, or None when the product has no MIG (or is unknown)."""
    if mig_profiles.product(product_name) is None:
        return None
    key = mig_profiles.product_key(product_name)
    for prefix in sorted(MIG_DRIVER, key=len, reverse=True):
        if key.startswith(prefix):
            return MIG_DRIVER[prefix]
    return None


def mig_strategy_problems(node: str, config: str, strategy: str, products: Sequence[str], driver: Any) -> List[str]:
    """Whether a node's GPUs (NVML product names) and driver can serve a device plugin MIG strategy."""
    if strategy not in ("single", "mixed") or not products:
        return []
    where = "node %s: nvidia_device_plugin_configs[%r].flags.migStrategy=%s" % (node, config, strategy)
    capable = [name for name in products if mig_driver_branch(name) is not None]
    if not capable:
        return ["%s, but its GPUs (%s) have no MIG (MIG-capable: %s); use migStrategy none for this node"
                % (where, ", ".join(sorted(set(products))), ", ".join(sorted(mig_profiles.PRODUCTS)))]
    branch = branch_of(driver)
    problems = []
    for name in sorted(set(capable)):
        needed = mig_driver_branch(name)
        if branch is not None and needed is not None and branch < needed:
            problems.append("%s, but its %s runs driver %s and MIG on it needs branch %d or newer (source %s)"
                            % (where, name, driver, needed, MIG_SOURCE))
    return problems


def node_gpu_summary(facts: Any) -> Dict[str, Any]:
    """{products, driver} from a host's nvidia_gpu facts (nvidia_gpu_facts), empty when they are unknown."""
    if not isinstance(facts, Mapping):
        return {"products": [], "driver": ""}
    gpus = facts.get("gpus") or []
    products = [str(gpu.get("name")) for gpu in gpus if isinstance(gpu, Mapping) and gpu.get("name")]
    return {"products": products, "driver": facts.get("driver_version") or ""}


# ---- Driver branch lifecycle ----------------------------------------------------------------------------------------

def driver_branch_end(branch: int) -> Optional[datetime.date]:
    """The last day of a known branch's support; None when the branch is unknown or no source gives its end."""
    _, month = DRIVER_BRANCHES.get(branch, ("", ""))
    if not month:
        return None
    year, number = (int(part) for part in month.split("-"))
    return datetime.date(year, number, calendar.monthrange(year, number)[1])


def _month_name(end: datetime.date) -> str:
    return "%s %d" % (calendar.month_name[end.month], end.year)


def supported_driver_branches(today: datetime.date) -> List[int]:
    """The known branches whose published end is on or after today, oldest first: the alternatives to recommend.
    A branch without a published end (a new feature branch: NVIDIA gives those none) is neither recommended nor
    warned about."""
    ends = {branch: driver_branch_end(branch) for branch in DRIVER_BRANCHES}
    return [branch for branch, end in sorted(ends.items()) if end is not None and end >= today]


def _describe(branch: int) -> str:
    kind = DRIVER_BRANCHES[branch][0]
    end = driver_branch_end(branch)
    return "%d (%s, until %s)" % (branch, kind, _month_name(end)) if end else "%d (%s)" % (branch, kind)


def driver_branch_eol_warning(driver: Any, today: datetime.date) -> str:
    """The warning for a driver (a branch "535" or a version "535.261.03") whose branch is past its end of life on
    today, naming the branch, its end and the supported branches; "" when it is supported or cannot be judged.

    A branch that is not in DRIVER_BRANCHES is past its end when it is older than every supported branch (NVIDIA
    supports no branch older than its oldest supported one); a newer unknown branch is not judged."""
    branch = branch_of(driver)
    if branch is None:
        return ""
    supported = supported_driver_branches(today)
    end = driver_branch_end(branch)
    known_supported = [known for known in DRIVER_BRANCHES if known in supported or driver_branch_end(known) is None]
    if branch in DRIVER_BRANCHES:
        if end is None or end >= today:
            return ""
        kind = DRIVER_BRANCHES[branch][0]
        what = "driver branch %d (%s) reached its end of life in %s" % (branch, kind, _month_name(end))
    elif known_supported and branch < min(known_supported):
        what = "driver branch %d is older than every branch NVIDIA still supports" % branch
    else:
        return ""
    return ("%s: NVIDIA publishes no more security or bug fixes for it. Supported data-center branches: %s. "
            "Choose one with nvidia_driver_branch (and nvidia_driver_source where this OS's distribution offers none; "
            "docs/nvidia_driver.md); source %s" % (what, ", ".join(_describe(b) for b in supported) or "none known",
                                                   DRIVER_LIFECYCLE_SOURCE))


def node_driver_eol_warning(node: str, driver: Any, today: datetime.date) -> str:
    """The validation report's and the diagnose summary's line for a node's running driver: '<node>: driver
    <version>: <driver_branch_eol_warning>', or "" when its branch is not past its end."""
    line = driver_branch_eol_warning(driver, today) if driver else ""
    return "%s: driver %s: %s" % (node, driver, line) if line else ""


def parse_day(text: Any) -> datetime.date:
    """A date from "YYYY-MM-DD" (or a date); ValueError otherwise."""
    if isinstance(text, datetime.date):
        return text
    return datetime.datetime.strptime(str(text).strip()[:10], "%Y-%m-%d").date()


def utc_today() -> datetime.date:
    return datetime.datetime.now(datetime.timezone.utc).date()
