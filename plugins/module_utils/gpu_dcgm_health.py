# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""GPU health problems from the DCGM exporter's series, as a Prometheus server answers instant queries for them.

The health check's second source beside each node's own facts (module_utils/gpu_xid, nvidia_gpu_facts): it covers
nodes the run cannot reach and faults the facts module does not read. Each query below is one DCGM field of the
exporter's counters file (roles/dcgm_exporter); a series above its threshold is a problem of its node's GPU. The node
comes from a label of the series: `node` where Prometheus relabels it from the pod's node (the prometheus role does),
or the exporter's own host label, which exporter 4.6.0-4.8.3 renamed from `Hostname` to `hostname`
(NVIDIA/dcgm-exporter#655): naming either form reads both, so a fleet part upgraded still has every node.
"""

from __future__ import absolute_import, annotations, division, print_function

from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple

from ansible_collections.gpu_ops.cluster.plugins.module_utils.gpu_xid import APPLICATION_XIDS, XID_NAMES

# (query, what a series above 0 means). The Xid gauge holds the last Xid the GPU reported (0: none).
QUERIES: Tuple[Tuple[str, str], ...] = (
    ("DCGM_FI_DEV_XID_ERRORS", "xid"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "uncorrected ECC errors since the driver loaded"),
    ("DCGM_FI_DEV_RETIRED_PENDING", "pages pending retirement"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "a row remapping failure"),
)


# The DCGM exporter's own host label: `hostname` from 4.6.0-4.8.3 on, `Hostname` up to 4.5.3-4.8.2 (#655).
EXPORTER_HOST_LABELS: Tuple[str, ...] = ("hostname", "Hostname")


def node_of(labels: Mapping[str, str], node_label: str) -> str | None:
    """The node a series belongs to: its node_label label; for the exporter's host label, either form of it."""
    names = EXPORTER_HOST_LABELS if node_label in EXPORTER_HOST_LABELS else (node_label,)
    return next((labels[name] for name in names if labels.get(name)), None)


def gpu_name(labels: Mapping[str, str]) -> str:
    gpu = labels.get("gpu", "?")
    uuid = labels.get("UUID") or labels.get("uuid")
    return "GPU %s (%s)" % (gpu, uuid) if uuid else "GPU %s" % gpu


def series_problems(field: str, what: str, series: Iterable[Mapping[str, Any]], node_label: str,
                    xid_ignore: Sequence[int] = APPLICATION_XIDS) -> Dict[str, List[str]]:
    """Node -> problems, from one query's vector result ([{metric: {...}, value: [time, "v"]}]). A series without
    the node label (node_of) is left out: it cannot be tied to a node."""
    found: Dict[str, List[str]] = {}
    for item in series:
        labels = item.get("metric") or {}
        node = node_of(labels, node_label)
        try:
            value = float((item.get("value") or [0, "0"])[1])
        except (TypeError, ValueError, IndexError):
            continue
        if not node or not value > 0:  # NaN (no sample value) is no problem either
            continue
        if what == "xid":
            code = int(value)
            if code in xid_ignore:
                continue
            meaning = " (%s)" % XID_NAMES[code] if code in XID_NAMES else ""
            problem = "%s: the DCGM exporter reports Xid %d%s" % (gpu_name(labels), code, meaning)
        else:
            problem = "%s: the DCGM exporter reports %s (%s = %g)" % (gpu_name(labels), what, field, value)
        found.setdefault(node, []).append(problem)
    return found


def merge(*parts: Mapping[str, List[str]]) -> Dict[str, List[str]]:
    merged: Dict[str, List[str]] = {}
    for part in parts:
        for node, problems in part.items():
            merged.setdefault(node, []).extend(problems)
    return {node: sorted(set(problems)) for node, problems in sorted(merged.items())}
