"""What the tests read from PromQL: the metric names an expression selects, the queries of a Grafana dashboard, the
metric names the drift runner writes, and the dashboard queries whose metrics neither the DCGM exporter's counters
enable nor the drift runner writes. Test code only: the roles judge dashboards by structure
(plugins/filter/monitoring.py) and PromQL by promtool."""

from __future__ import annotations

import json
import re
from types import ModuleType
from typing import Any, Dict, Iterator, List, Set, Tuple

_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
             "inf", "nan", "atan2"}
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_TOKEN = re.compile(r"(?P<number>0x[0-9a-fA-F]+|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?:[a-z]+)?)"
                    r"|(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<call>\s*\()?")
_VARIABLE = re.compile(r"\$\{?(\w+)(?::\w+)?\}?|\[\[(\w+)\]\]")


def _without_brackets(expr: str, opening: str, closing: str) -> str:
    out, depth = [], 0
    for char in expr:
        if char == opening:
            depth += 1
        elif char == closing and depth:
            depth -= 1
        elif not depth:
            out.append(char)
    return "".join(out)


def promql_metric_names(expr: str) -> List[str]:
    """Metric names an expression selects, sorted (`foo{a="b"}`, `{__name__="foo"}`, `foo[5m]`); not functions,
    keywords, label names or numbers."""
    names: Set[str] = set()
    for matcher in re.finditer(r'__name__\s*=\s*"([^"]+)"', expr):
        names.add(matcher.group(1))
    text = _STRING.sub(" ", expr)
    text = _without_brackets(_without_brackets(text, "{", "}"), "[", "]")
    text = _GROUPING.sub(" ", text)
    for token in _TOKEN.finditer(text):
        name = token.group("name")
        if name and not token.group("call") and name not in _KEYWORDS:
            names.add(name)
    return sorted(names)


def grafana_substitute(expr: str) -> str:
    """A dashboard query with Grafana's template variables replaced by plain values, so promtool can parse it."""
    def value(match: "re.Match[str]") -> str:
        name = match.group(1) or match.group(2)
        return "5m" if name in ("__rate_interval", "__interval", "__range") else "x"

    return _VARIABLE.sub(value, expr)



def _panels(panels: Any) -> Iterator[Dict[str, Any]]:
    for panel in panels if isinstance(panels, list) else []:
        if isinstance(panel, dict):
            yield panel
            yield from _panels(panel.get("panels"))  # rows carry their collapsed panels


def dashboard_panels(dashboard: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Every panel of a dashboard, those inside rows included."""
    return list(_panels(dashboard.get("panels")))


def dashboard_queries(dashboard: Dict[str, Any]) -> List[Tuple[str, str]]:
    """(where, expr) for every Prometheus query of a dashboard: panel targets and query variables."""
    queries = []
    for panel in _panels(dashboard.get("panels")):
        for index, target in enumerate(panel.get("targets") or []):
            if isinstance(target, dict) and target.get("expr"):
                queries.append(("panel %r target %d" % (panel.get("title"), index), target["expr"]))
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        if isinstance(variable, dict) and variable.get("type") == "query":
            query = variable.get("query")
            expr = query.get("query") if isinstance(query, dict) else query
            if isinstance(expr, str) and expr:
                # label_values(metric, label) is Grafana's, not PromQL: keep the selector inside it.
                match = re.match(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$", expr)
                queries.append(("variable %r" % variable.get("name"), match.group(1) if match else expr))
    return queries


def drift_metric_names(drift: ModuleType) -> Set[str]:
    """The metric names runner/gpu_ops_drift.py (the loaded module) writes: each has a TYPE line, samples or not."""
    text = drift.metrics_text({"finished": "2026-12-04T03:00:00Z", "result": "drift", "duration_s": 1, "items": [],
                               "unverifiable": [], "unreachable": []}, None)
    return set(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE))


def dashboard_metric_problems(dashboards: Dict[str, Any], enabled: List[str], extra: List[str]) -> List[str]:
    """Queries naming a metric that neither the exporter's counters (`enabled`) nor `extra` (the drift runner's
    metrics) provide."""
    known = set(enabled) | set(extra)
    problems = []
    for name, source in sorted(dashboards.items()):
        model = json.loads(source) if isinstance(source, str) else source
        for where, expr in dashboard_queries(model):
            unknown = [metric for metric in promql_metric_names(grafana_substitute(expr)) if metric not in known]
            if unknown:
                problems.append("dashboard %s %s reads %s, which the DCGM exporter's counters do not enable "
                                "(nor does the drift runner write it)" % (name, where, ", ".join(unknown)))
    return problems
