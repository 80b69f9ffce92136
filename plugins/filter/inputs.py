# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Input checks every role's preflight shares."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping

from ansible.errors import AnsibleFilterError
from ansible_collections.gpu_ops.cluster.plugins.module_utils import input_forms

# Type names as the operator knows them (Ansible 2.19 hands filters tagged subclasses such as _AnsibleTaggedStr).
_TYPE_NAMES = ((bool, "bool"), (str, "str"), (int, "int"), (float, "float"), (list, "list"), (dict, "dict"))


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return next((name for kind, name in _TYPE_NAMES if isinstance(value, kind)), type(value).__name__)


def bool_input_problems(inputs: Mapping[str, Any]) -> List[str]:
    """One message per input that is not a real boolean.

    A role's argument spec accepts "false", "no" or 0 for a bool but leaves the value as it was given, and Jinja reads
    the string "false" as true: a quoted boolean would silently do the opposite of what it says."""
    return ["%s=%s is not a boolean (%s): use true or false, unquoted."
            % (name, json.dumps(value, default=str), _type_name(value))
            for name, value in inputs.items() if not isinstance(value, bool)]


def input_form_problems(inputs: Any) -> List[str]:
    """One message per input without its form (a port, a duration, a URL, ...): module_utils/input_forms.py."""
    try:
        return input_forms.input_form_problems(inputs)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"bool_input_problems": bool_input_problems, "input_form_problems": input_form_problems}
