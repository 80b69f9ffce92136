# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Checks of the DCGM exporter's counters (roles/dcgm_exporter preflight) and the metric names they enable."""

from __future__ import annotations

import re
from typing import Any, Dict, List

_FIELD = re.compile(r"^DCGM_(FI|EXP)_[A-Z0-9_]+\Z")
TYPES = ("gauge", "counter", "label")


def dcgm_counter_problems(counters: Any) -> List[str]:
    """Every problem of a counters list [{field, type, help}], naming the entry, the value and what is allowed."""
    if not isinstance(counters, list) or not counters:
        return ["dcgm_exporter counters=%r; allowed: a non-empty list of {field, type, help}" % (counters,)]
    problems = []
    seen: Dict[str, int] = {}
    for index, counter in enumerate(counters):
        if not isinstance(counter, dict):
            problems.append("counter[%d]=%r; allowed: a mapping {field, type, help}" % (index, counter))
            continue
        field = counter.get("field")
        if not isinstance(field, str) or not _FIELD.match(field):
            problems.append("counter[%d].field=%r; allowed: a DCGM field name such as DCGM_FI_DEV_GPU_TEMP"
                            % (index, field))
        elif field in seen:
            problems.append("counter[%d].field=%r repeats counter[%d]" % (index, field, seen[field]))
        else:
            seen[field] = index
        if counter.get("type") not in TYPES:
            problems.append("counter[%d].type=%r; allowed: %s" % (index, counter.get("type"), ", ".join(TYPES)))
        help_text = counter.get("help")
        if not isinstance(help_text, str) or not help_text.strip() or "," in help_text or "\n" in help_text:
            problems.append("counter[%d].help=%r; allowed: one line of text without commas (counters.csv is CSV)"
                            % (index, help_text))
    return problems


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"dcgm_counter_problems": dcgm_counter_problems}
