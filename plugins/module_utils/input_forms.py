# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""The forms a role input can have (ports, counts, timeouts, durations, cron schedules, quantities, URLs, label keys
and values, object names, namespaces a role may take (never Kubernetes' own), image references, paths), each judged
once here for every role's preflight. systemd calendar expressions and time spans are not here: systemd-analyze judges
them on the host (drift_schedule's preflight).

``input_form_problems`` (the filter of the same name in plugins/filter/inputs.py) takes ``{path: {form, value,
options}}`` and returns one message per input that does not have its form, shaped

    <path>=<value as JSON> is not <what the form is>; allowed: <what is allowed>

where path is the variable's name, or for nested data the top-level variable then the key path
(``training_workloads_pytorch_image.tag``, ``dcgm_exporter_resources.limits.memory``, ``tenancy_reserved_namespaces[2]``).
Numbers must be real integers, as booleans must be real booleans: ``-e name=value`` and quoted YAML give strings, and a
string port or count is refused rather than guessed at. The Kubernetes forms come from k8s_values, which the modules
share too.
"""

from __future__ import absolute_import, annotations, division, print_function

import json
import re
from typing import Any, Callable, Dict, List, Mapping, Optional

from ansible_collections.gpu_ops.cluster.plugins.module_utils.gpu_cluster import parse_selector
from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_values import (
    LABEL_KEY_ALLOWED, LABEL_VALUE_ALLOWED, QUANTITY_ALLOWED, is_dns_label, is_dns_subdomain, is_label_key,
    is_label_value, parse_quantity)

# Prometheus's own duration grammar (model.ParseDuration): units in descending order, each at most once.
PROMETHEUS_DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?\Z")
_PROMETHEUS_UNIT_SECONDS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
# A cron field: *, numbers, ranges, steps, lists, month and weekday names (what the CronJob controller parses).
_CRON_FIELD = re.compile(r"^(\*|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?(,(\*|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?)*\Z")
_CRON_MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
# The reference grammar of distribution: registry[:port]/path[:tag][@sha256:digest], lower-case path components.
_REGISTRY = r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}"
IMAGE = re.compile(r"^(?:%s/)?%s(?:/%s)*(?::%s)?(?:@%s)?\Z" % (_REGISTRY, _PATH_COMPONENT, _PATH_COMPONENT, _TAG, _DIGEST))
_IMAGE_REGISTRY = re.compile(r"^%s(?:/%s)*\Z" % (_REGISTRY, _PATH_COMPONENT))
_IMAGE_REPOSITORY = re.compile(r"^%s(?:/%s)*\Z" % (_PATH_COMPONENT, _PATH_COMPONENT))
_IMAGE_TAG = re.compile(r"^%s\Z" % _TAG)
_IMAGE_DIGEST = re.compile(r"^%s\Z" % _DIGEST)
_URL = re.compile(r"^https?://[^/\s]+(/\S*)?\Z")
# An IANA service name, as a Service port's name: at most 15 lower-case letters, digits and '-', at least one letter.
_PORT_NAME = re.compile(r"^(?=.*[a-z])(?!.*--)[a-z0-9](?:[-a-z0-9]{0,13}[a-z0-9])?\Z")
# A command: a name looked up in PATH, or an absolute path.
_COMMAND = re.compile(r"^(?:/[^\s]*|[A-Za-z0-9_.+-]+)\Z")
INT32_MAX = 2147483647
# Namespaces Kubernetes itself runs in or creates: a role that labels one (Pod Security), owns it or puts its objects
# there takes it over from the cluster (kube-system labelled restricted refuses every privileged system pod). Every
# kube-* name is Kubernetes' own too (its docs reserve the prefix).
SYSTEM_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")
_SYSTEM_NAMESPACE_PREFIX = "kube-"
ROLE_NAMESPACE_ALLOWED = ("a DNS label (lower-case letters, digits and '-', starting and ending with a letter or digit, "
                          "at most 63) other than %s or any other kube-* name" % ", ".join(SYSTEM_NAMESPACES))


def is_int(value: Any) -> bool:
    """A real integer: booleans are ints to Python but never a count to an operator."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_prometheus_duration(value: Any) -> bool:
    match = PROMETHEUS_DURATION.match(value) if isinstance(value, str) and value not in ("", "0") else None
    return bool(match) and any(int(part) for part in match.groups() if part)


def prometheus_duration_seconds(value: str) -> float:
    """A Prometheus duration (1h30m, 15d) in seconds; ValueError when it is not one."""
    if not is_prometheus_duration(value):
        raise ValueError("%r is not a Prometheus duration such as 3h or 1h30m" % (value,))
    groups = PROMETHEUS_DURATION.match(value).groups()
    seconds = sum(int(part) * unit for part, unit in zip(groups, _PROMETHEUS_UNIT_SECONDS) if part)
    return int(seconds) if float(seconds).is_integer() else seconds


def is_cron_schedule(value: Any) -> bool:
    """Five cron fields, or one of the macros the CronJob controller accepts."""
    if not isinstance(value, str):
        return False
    if value.strip() in _CRON_MACROS:
        return True
    fields = value.split()
    return len(fields) == 5 and all(_CRON_FIELD.match(field) for field in fields)


def is_image_reference(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 255 and bool(IMAGE.match(value))


def is_url(value: Any) -> bool:
    return isinstance(value, str) and bool(_URL.match(value))


# A Prometheus server's base URL (its root, or the --web.route-prefix it is served under): the readers append
# /api/v1/query themselves (gpu_prometheus_health; Grafana's Prometheus data source), so a URL that already names the
# API, a query page or carries a query string would ask for .../api/v1/api/v1/query and get 404s.
_PROMETHEUS_API_PATH = re.compile(r"/(api(/v1)?(/.*)?|graph|query|alerts|targets)/?\Z")


def is_prometheus_url(value: Any) -> bool:
    if not is_url(value) or "?" in value or "#" in value:
        return False
    path = value.split("://", 1)[1].partition("/")[2]
    return not _PROMETHEUS_API_PATH.search("/" + path)


def is_absolute_path(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("/") and not any(char in value for char in "\n\r\0")


def is_label_selector(value: Any) -> bool:
    """An equality-based selector (key=value,key!=value) whose keys and values are label keys and values."""
    if not isinstance(value, str) or not value.strip():
        return False
    try:
        terms = parse_selector(value)
    except ValueError:
        return False
    return all(is_label_key(key) and is_label_value(label) for key, _operator, label in terms)


def is_system_namespace(value: Any) -> bool:
    """A namespace of Kubernetes itself: the four it creates, or any kube-* name."""
    return isinstance(value, str) and (value in SYSTEM_NAMESPACES or value.startswith(_SYSTEM_NAMESPACE_PREFIX))


def is_role_namespace(value: Any) -> bool:
    """A namespace a role may create, label or put its objects in: a DNS label that is not Kubernetes' own."""
    return is_dns_label(value) and not is_system_namespace(value)


def _one_line(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != "" and not any(char in value for char in "\n\r\0")


# ---- the forms ------------------------------------------------------------------------------------------------------

class Form:
    """What a form is called in a message, what it allows, and the check of one value (with the entry's options)."""

    def __init__(self, what: str, allowed: Callable[[Mapping[str, Any]], str], check: Callable[[Any, Mapping[str, Any]], bool]):
        self.what = what
        self.allowed = allowed
        self.check = check


def _whole(value: Any, options: Mapping[str, Any], low: int) -> bool:
    high = options.get("max")
    return is_int(value) and value >= options.get("min", low) and (high is None or value <= high)


def _whole_allowed(options: Mapping[str, Any], low: int, unit: str = "") -> str:
    low = options.get("min", low)
    high = options.get("max")
    text = "an integer %s" % (("%d-%d" % (low, high)) if high is not None else ">= %d" % low)
    return text + unit


def _quantity(value: Any, options: Mapping[str, Any]) -> bool:
    quantity = parse_quantity(value)
    return quantity is not None and (quantity > 0 if options.get("positive") else quantity >= 0)


def _quantity_allowed(options: Mapping[str, Any]) -> str:
    return QUANTITY_ALLOWED + (", above 0" if options.get("positive") else "")


FORMS: Dict[str, Form] = {
    "port": Form("a TCP port", lambda o: "an integer 1-65535", lambda v, o: is_int(v) and 0 < v < 65536),
    "port_name": Form("a port name", lambda o: "an IANA service name: at most 15 lower-case letters, digits and '-', "
                      "with a letter", lambda v, o: isinstance(v, str) and bool(_PORT_NAME.match(v))),
    "count": Form("a whole number", lambda o: _whole_allowed(o, 0), lambda v, o: _whole(v, o, 0)),
    "seconds": Form("a number of seconds", lambda o: _whole_allowed(o, 1, " (seconds)"), lambda v, o: _whole(v, o, 1)),
    "prometheus_duration": Form("a Prometheus duration", lambda o: "units y, w, d, h, m, s, ms in that order, above "
                                "0, such as 15d, 12h, 30s or 1h30m", lambda v, o: is_prometheus_duration(v)),
    "cron": Form("a cron schedule", lambda o: 'five cron fields such as "17 * * * *", or @hourly, @daily, ...',
                 lambda v, o: is_cron_schedule(v)),
    "quantity": Form("a Kubernetes quantity", _quantity_allowed, _quantity),
    "url": Form("a URL", lambda o: "http://host/path or https://host/path", lambda v, o: is_url(v)),
    "prometheus_url": Form("a Prometheus server URL", lambda o: "the server's base URL, such as "
                           "http://prometheus.monitoring.svc:9090 (or under its route prefix, .../prometheus), without "
                           "/api/v1, a page or a query string: the API path is added to it",
                           lambda v, o: is_prometheus_url(v)),
    "dns_label": Form("a DNS label", lambda o: "lower-case letters, digits and '-', starting and ending with a letter or "
                      "digit, at most 63", lambda v, o: is_dns_label(v)),
    # A namespace a role writes to (creates, labels, puts its objects in). A namespace a role only reads or names (the
    # DNS namespace of a NetworkPolicy, where to find the device plugin's pods) is a dns_label: kube-system is right
    # there.
    "role_namespace": Form("a namespace a role may take", lambda o: ROLE_NAMESPACE_ALLOWED,
                           lambda v, o: is_role_namespace(v)),
    "dns_subdomain": Form("an object name", lambda o: "a DNS subdomain: lower-case letters, digits, '-' and '.', "
                          "starting and ending with a letter or digit, at most 253", lambda v, o: is_dns_subdomain(v)),
    "label_key": Form("a label key", lambda o: LABEL_KEY_ALLOWED, lambda v, o: is_label_key(v)),
    "label_value": Form("a label value", lambda o: LABEL_VALUE_ALLOWED, lambda v, o: is_label_value(v)),
    "label_selector": Form("a label selector", lambda o: "key=value or key!=value terms joined by ',', with label keys "
                           "and values", lambda v, o: is_label_selector(v)),
    "image": Form("an image reference", lambda o: "an image reference such as registry.example.com/gpu-ops-ee:1.2.0 "
                  "([registry/]repository[:tag][@sha256:digest])", lambda v, o: is_image_reference(v)),
    "image_registry": Form("an image registry", lambda o: "host[:port][/path] such as nvcr.io or "
                           "registry.example.com:5000/mirror", lambda v, o: isinstance(v, str) and bool(_IMAGE_REGISTRY.match(v))),
    "image_repository": Form("an image repository", lambda o: "lower-case path components such as nvidia/pytorch",
                             lambda v, o: isinstance(v, str) and bool(_IMAGE_REPOSITORY.match(v))),
    "image_tag": Form("an image tag", lambda o: "1-128 letters, digits, '_', '.' or '-', not starting with '.' or '-'",
                      lambda v, o: isinstance(v, str) and bool(_IMAGE_TAG.match(v))),
    "image_digest": Form("an image digest", lambda o: "sha256: and 64 lower-case hex digits",
                         lambda v, o: isinstance(v, str) and bool(_IMAGE_DIGEST.match(v))),
    "absolute_path": Form("an absolute path", lambda o: "one line starting with /", lambda v, o: is_absolute_path(v)),
    "path": Form("a path", lambda o: "a non-empty path on one line", lambda v, o: _one_line(v)),
    "command": Form("a command", lambda o: "a program name found in PATH (letters, digits, '_', '.', '+', '-') or an "
                    "absolute path", lambda v, o: isinstance(v, str) and bool(_COMMAND.match(v))),
}

# Forms of structured values: each walks its value and names what is inside by its key path.
_IMAGE_PARTS = {"registry": "image_registry", "repository": "image_repository", "tag": "image_tag",
                "digest": "image_digest"}


def _show(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def _message(path: str, value: Any, what: str, allowed: str) -> str:
    return "%s=%s is not %s; allowed: %s" % (path, _show(value), what, allowed)


def _key_path(path: str, key: Any) -> str:
    """path.key for plain keys, path["key"] for keys a dot path would misread (label keys, resource names)."""
    if isinstance(key, str) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*\Z", key):
        return "%s.%s" % (path, key)
    return "%s[%s]" % (path, _show(key))


def _mapping_problems(path: str, value: Any, what: str, allowed: str) -> Optional[List[str]]:
    if not isinstance(value, Mapping):
        return [_message(path, value, what, allowed)]
    return None


def _labels_problems(path: str, value: Any, options: Mapping[str, Any]) -> List[str]:
    problems = _mapping_problems(path, value, "a mapping of labels", "{label key: label value as a string}")
    if problems is not None:
        return problems
    problems = []
    for key, label in value.items():
        if not is_label_key(key):
            problems.append("%s key %s is not a label key; allowed: %s" % (path, _show(key), LABEL_KEY_ALLOWED))
        elif not is_label_value(label):
            problems.append(_message(_key_path(path, key), label, "a label value", LABEL_VALUE_ALLOWED + " (a string)"))
    return problems


def _annotations_problems(path: str, value: Any, options: Mapping[str, Any]) -> List[str]:
    problems = _mapping_problems(path, value, "a mapping of annotations", "{annotation key: string}")
    if problems is not None:
        return problems
    problems = []
    for key, annotation in value.items():
        if not is_label_key(key):
            problems.append("%s key %s is not an annotation key; allowed: %s" % (path, _show(key), LABEL_KEY_ALLOWED))
        elif not isinstance(annotation, str):
            problems.append(_message(_key_path(path, key), annotation, "an annotation value", "a string (quote numbers "
                                     "and booleans)"))
    return problems


def _quantities_problems(path: str, value: Any, options: Mapping[str, Any]) -> List[str]:
    problems = _mapping_problems(path, value, "a mapping of quantities", "{resource name: Kubernetes quantity}")
    if problems is not None:
        return problems
    problems = []
    for name, quantity in value.items():
        if not is_label_key(name):
            problems.append("%s key %s is not a resource name; allowed: %s" % (path, _show(name), LABEL_KEY_ALLOWED))
        else:
            problems.extend(form_problems(_key_path(path, name), "quantity", quantity))
    return problems


def _resources_problems(path: str, value: Any, options: Mapping[str, Any]) -> List[str]:
    problems = _mapping_problems(path, value, "container resources", "{requests: {..}, limits: {..}} of quantities")
    if problems is not None:
        return problems
    problems = ["%s.%s is not a known key; allowed: requests, limits" % (path, key)
                for key in value if key not in ("requests", "limits")]
    for key in ("requests", "limits"):
        if value.get(key) is not None:
            problems.extend(_quantities_problems("%s.%s" % (path, key), value[key], options))
    return problems


def _image_parts_problems(path: str, value: Any, options: Mapping[str, Any]) -> List[str]:
    problems = _mapping_problems(path, value, "an image", "{registry, repository, tag[, digest]}")
    if problems is not None:
        return problems
    problems = ["%s.%s is not a known key; allowed: %s" % (path, key, ", ".join(_IMAGE_PARTS))
                for key in value if key not in _IMAGE_PARTS]
    for key, form in _IMAGE_PARTS.items():
        if key == "digest" and value.get(key) in (None, ""):
            continue
        problems.extend(form_problems("%s.%s" % (path, key), form, value.get(key)))
    return problems


# A pod's tolerations as the API server validates them (Kubernetes' ValidateTolerations, pkg/apis/core/validation): a
# key is a label key (empty only with operator Exists, which then tolerates every taint); Exists has no value, Equal
# (the default) a label value; the effect is one of the three taint effects or empty (all); tolerationSeconds only
# with NoExecute. Unknown keys are refused (the project's rule: the API server would drop them silently).
_TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")
_TOLERATION_OPERATORS = ("Exists", "Equal")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _toleration_problems(path: str, item: Any) -> List[str]:
    if not isinstance(item, Mapping):
        return [_message(path, item, "a toleration", "{key, operator, value, effect, tolerationSeconds}")]
    problems = ["%s.%s is not a known key; allowed: %s" % (path, key, ", ".join(_TOLERATION_KEYS))
                for key in item if key not in _TOLERATION_KEYS]
    key, operator, value = item.get("key") or "", item.get("operator") or "Equal", item.get("value")
    if operator not in _TOLERATION_OPERATORS:
        problems.append(_message(path + ".operator", item.get("operator"), "a toleration operator", "Exists, Equal"))
    if key and not is_label_key(key):
        problems.append(_message(path + ".key", key, "a taint key", LABEL_KEY_ALLOWED))
    elif not key and operator != "Exists":
        problems.append(_message(path + ".operator", item.get("operator"), "allowed without a key",
                                 "Exists (an empty key with Exists tolerates every taint), or give a key"))
    if operator == "Exists" and value not in (None, ""):
        problems.append(_message(path + ".value", value, "allowed with operator Exists", "no value"))
    elif operator == "Equal" and value not in (None, "") and not is_label_value(value):
        problems.append(_message(path + ".value", value, "a taint value", LABEL_VALUE_ALLOWED + " (a string)"))
    effect = item.get("effect")
    if effect not in (None, "") and effect not in _TAINT_EFFECTS:
        problems.append(_message(path + ".effect", effect, "a taint effect",
                                 ", ".join(_TAINT_EFFECTS) + ", or empty for all"))
    seconds = item.get("tolerationSeconds")
    if seconds is not None:
        if effect != "NoExecute":
            problems.append(_message(path + ".tolerationSeconds", seconds, "allowed with effect %s" % _show(effect),
                                     "tolerationSeconds only with effect NoExecute"))
        elif not is_int(seconds):
            problems.append(_message(path + ".tolerationSeconds", seconds, "a number of seconds", "an integer"))
    return problems


def _tolerations_problems(path: str, value: Any, options: Mapping[str, Any]) -> List[str]:
    if not isinstance(value, list):
        return [_message(path, value, "a list of tolerations", "[{key, operator, value, effect}, ...]")]
    return [problem for index, item in enumerate(value)
            for problem in _toleration_problems("%s[%d]" % (path, index), item)]


STRUCTURED: Dict[str, Callable[[str, Any, Mapping[str, Any]], List[str]]] = {
    "labels": _labels_problems,
    "tolerations": _tolerations_problems,
    "annotations": _annotations_problems,
    "quantities": _quantities_problems,
    "resources": _resources_problems,
    "image_parts": _image_parts_problems,
}
FORM_NAMES = tuple(sorted(set(FORMS) | set(STRUCTURED)))
_OPTIONS = ("optional", "elements", "min", "max", "positive")


def form_problems(path: str, form: str, value: Any, **options: Any) -> List[str]:
    """The problems of one input: [] when value has the form.

    optional: "" (and null) are allowed too, meaning "not set". elements: value is a list, each element of the form.
    min / max: bounds of count and seconds. positive: a quantity above 0.
    """
    if form not in FORMS and form not in STRUCTURED:
        raise ValueError("%s: unknown form %r; known: %s" % (path, form, ", ".join(FORM_NAMES)))
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ValueError("%s: unknown option(s) %s of form %s; known: %s" % (path, ", ".join(unknown), form,
                                                                             ", ".join(_OPTIONS)))
    if options.get("optional") and value in ("", None):
        return []
    if options.get("elements"):
        if not isinstance(value, list):
            return [_message(path, value, "a list", "a list, each element %s" % _describe(form, options))]
        element_options = {key: option for key, option in options.items() if key not in ("elements", "optional")}
        return [problem for index, element in enumerate(value)
                for problem in form_problems("%s[%d]" % (path, index), form, element, **element_options)]
    if form in STRUCTURED:
        return STRUCTURED[form](path, value, options)
    spec = FORMS[form]
    if spec.check(value, options):
        return []
    allowed = spec.allowed(options)
    return [_message(path, value, spec.what, ('"" (not set) or ' + allowed) if options.get("optional") else allowed)]


def _describe(form: str, options: Mapping[str, Any]) -> str:
    if form in FORMS:
        return "%s (%s)" % (FORMS[form].what, FORMS[form].allowed(options))
    return form.replace("_", " ")


def input_form_problems(inputs: Any) -> List[str]:
    """Every problem of {path: {form, value, options...}} (or a list of {path, form, value, options...}), in order."""
    if isinstance(inputs, Mapping):
        entries = [dict(entry, path=path) if isinstance(entry, Mapping) else {"path": path, "entry": entry}
                   for path, entry in inputs.items()]
    elif isinstance(inputs, list):
        entries = list(inputs)
    else:
        raise ValueError("input_form_problems takes {path: {form, value}} or a list of {path, form, value}, not %r"
                         % (inputs,))
    problems: List[str] = []
    for entry in entries:
        if not isinstance(entry, Mapping) or "form" not in entry or "value" not in entry or "path" not in entry:
            raise ValueError("input_form_problems: %r is not {path, form, value[, options]}" % (entry,))
        options = {key: option for key, option in entry.items() if key not in ("path", "form", "value")}
        problems.extend(form_problems(str(entry["path"]), str(entry["form"]), entry["value"], **options))
    return problems
