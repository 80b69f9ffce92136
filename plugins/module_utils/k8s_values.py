# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""The forms of Kubernetes values, checked once for every role's preflight filter and the modules: DNS labels and
subdomains (object names), label keys and values, resource quantities, and JSON objects kept in annotations.

Quantities are parsed by the kubernetes client's own parser (``kubernetes.utils.parse_quantity``, the grammar of
resource.Quantity), so a preflight accepts exactly what the API server accepts (``1.5Gi``, ``500m``, ``0``) and refuses
what it refuses. The client is required on the control host already (kubernetes.core). Its parser's own file
(``kubernetes/utils/quantity.py``, which needs only ``decimal``) is loaded when first needed, without the package's
``__init__``: that imports the whole generated API client, about 0.2 s of CPU in every Ansible worker that templates
a quantity.
"""

from __future__ import absolute_import, annotations, division, print_function

import importlib.util
import json
import os
import re
import sys
from decimal import Decimal
from typing import Any, Dict, Mapping, Optional, Tuple

DNS_LABEL = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?\Z")
# Kubernetes' IsDNS1123Subdomain: dot-separated labels of lower-case letters, digits and '-', each starting and ending
# with a letter or digit ("a..b" and "a.-b" are refused), at most 253 characters in all.
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}\Z)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*\Z")
# A label value: empty, or 1-63 of letters, digits, '-', '_', '.', starting and ending with a letter or digit.
LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?\Z")
# The name part of a label key: as a non-empty label value.
LABEL_NAME = re.compile(r"^[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")

LABEL_KEY_ALLOWED = "[prefix/]name, a DNS subdomain prefix and a name of 1-63 letters, digits, '-', '_' or '.'"
LABEL_VALUE_ALLOWED = ("at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
QUANTITY_ALLOWED = "a Kubernetes quantity such as 8, 500m, 1.5Gi or 64Gi"
_CLIENT_PARSE_QUANTITY = None


def is_dns_label(value: Any) -> bool:
    return isinstance(value, str) and bool(DNS_LABEL.match(value))


def is_dns_subdomain(value: Any) -> bool:
    return isinstance(value, str) and bool(DNS_SUBDOMAIN.match(value))


def is_label_value(value: Any, allow_empty: bool = True) -> bool:
    return isinstance(value, str) and bool(LABEL_VALUE.match(value)) and (allow_empty or value != "")


def is_label_key(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    prefix, slash, name = value.rpartition("/")
    return (not slash or is_dns_subdomain(prefix)) and bool(LABEL_NAME.match(name))


def _client_parser() -> Any:
    """kubernetes.utils.parse_quantity, from the client's quantity.py alone where it can be found, else imported."""
    module = sys.modules.get("kubernetes.utils.quantity")
    if module is None:
        spec = importlib.util.find_spec("kubernetes")
        path = os.path.join(os.path.dirname(spec.origin), "utils", "quantity.py") if spec and spec.origin else ""
        if os.path.isfile(path):
            alone = importlib.util.spec_from_file_location("_gpu_ops_kubernetes_quantity", path)
            module = importlib.util.module_from_spec(alone)
            alone.loader.exec_module(module)
        else:
            from kubernetes.utils import quantity as module
    return module.parse_quantity


def parse_quantity(value: Any) -> Optional[Decimal]:
    """The quantity's value as the API server reads it, or None when it is not a quantity (booleans, lists, ...)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    # The client's parser lets blanks through ("5 Gi", " 4"); resource.Quantity's grammar, and so the API server, does not.
    if isinstance(value, str) and (not value or any(char.isspace() for char in value)):
        return None
    global _CLIENT_PARSE_QUANTITY  # pylint: disable=global-statement
    if _CLIENT_PARSE_QUANTITY is None:
        _CLIENT_PARSE_QUANTITY = _client_parser()
    try:
        return Decimal(_CLIENT_PARSE_QUANTITY(value))
    except (ValueError, TypeError, ArithmeticError):
        return None


def quantity_problem(path: str, value: Any, minimum: Decimal = Decimal(0), strings_only: bool = False,
                     positive: bool = False) -> Optional[str]:
    """None when value is a quantity >= minimum (> 0 with positive), else a message naming path and value."""
    quantity = None if strings_only and not isinstance(value, str) else parse_quantity(value)
    if quantity is None:
        return "%s=%r; allowed: %s%s" % (path, value, QUANTITY_ALLOWED, " (quoted, as a string)" if strings_only else "")
    if positive and quantity <= 0:
        return "%s=%r; allowed: a quantity above 0" % (path, value)
    if quantity < minimum:
        return "%s=%r; allowed: a quantity >= %s" % (path, value, minimum)
    return None


def json_annotation(obj: Mapping[str, Any], key: str) -> Optional[Dict[str, Any]]:
    """The JSON object an object's annotation `key` holds; None when the annotation is missing, empty, not JSON or
    JSON but not an object (a person's hand edit, another tool's value): the caller then acts as if nothing was
    recorded rather than failing on a value it does not own."""
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
    try:
        value = json.loads(text) if text else None
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def unscheduled(pod: Mapping[str, Any]) -> Tuple[Optional[str], Optional[str]]:
    """The scheduler's reason and message while the pod's PodScheduled condition is False; (None, None) otherwise."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    scheduled = next((c for c in conditions if c.get("type") == "PodScheduled"), None) or {}
    if scheduled.get("status") != "False":
        return None, None
    return scheduled.get("reason"), scheduled.get("message")
