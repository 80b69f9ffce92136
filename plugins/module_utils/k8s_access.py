# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Whether a kubeconfig can do a cluster role's job, as decisions on plain data (gpu_k8s_access does the I/O).

A role states what it needs as (verbs, group, resource, namespace); each verb becomes one SelfSubjectAccessReview.
Failures of the kubeconfig itself (the server's CA, an expired client certificate, refused credentials, an unreachable
server) become one sentence that names the kubeconfig, the cluster, the user and the server, instead of a stack trace
from the first task that happens to call the API server.
"""

from __future__ import annotations

import datetime
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

# The verbs a role may need; the API server knows more (escalate, bind, impersonate), none of which a role uses.
KNOWN_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")

# One SelfSubjectAccessReview: (verb, group, resource, subresource, namespace, name). Empty strings for "none"/"all".
Check = Tuple[str, str, str, str, str, str]


def need_problems(needs: Sequence[Mapping[str, Any]]) -> List[str]:
    """What is wrong with the needs as given (the caller's mistake, not the kubeconfig's)."""
    problems = []
    for index, need in enumerate(needs):
        verbs = need.get("verbs") or []
        unknown = [verb for verb in verbs if verb not in KNOWN_VERBS]
        if not verbs or unknown:
            problems.append(f"needs[{index}] ({need.get('resource')}): verbs {list(verbs)} must be a non-empty list of "
                            f"{', '.join(KNOWN_VERBS)}")
        if not need.get("resource") or "/" in str(need.get("resource")):
            problems.append(f"needs[{index}]: resource {need.get('resource')!r} must be a plural resource name such as "
                            "daemonsets (the group goes in group, a subresource in subresource)")
    return problems


def expand_needs(needs: Iterable[Mapping[str, Any]]) -> Tuple[List[Check], Dict[Check, List[str]]]:
    """One check per verb, duplicates merged in first-seen order; and who needs each (the needs' `by`)."""
    checks: List[Check] = []
    needed_by: Dict[Check, List[str]] = {}
    for need in needs:
        for verb in need.get("verbs") or []:
            check = (verb, need.get("group") or "", need["resource"], need.get("subresource") or "",
                     need.get("namespace") or "", need.get("name") or "")
            if check not in needed_by:
                checks.append(check)
                needed_by[check] = []
            by = need.get("by")
            if by and by not in needed_by[check]:
                needed_by[check].append(by)
    return checks, needed_by


def describe_check(check: Check) -> str:
    """'create apps/daemonsets in namespace gpu-monitoring', 'patch nodes (cluster-wide)'."""
    verb, group, resource, subresource, namespace, name = check
    what = f"{group}/{resource}" if group else resource
    if subresource:
        what += f"/{subresource}"
    if name:
        what += f" {name}"
    where = f"in namespace {namespace}" if namespace else "(cluster-wide)"
    return f"{verb} {what} {where}"


def resource_attributes(check: Check) -> Dict[str, str]:
    """The SelfSubjectAccessReview's spec.resourceAttributes for a check (empty fields left out)."""
    verb, group, resource, subresource, namespace, name = check
    attributes = {"verb": verb, "group": group, "resource": resource, "subresource": subresource,
                  "namespace": namespace, "name": name}
    return {key: value for key, value in attributes.items() if value or key == "group"}


def who(user: str, groups: Sequence[str] = ()) -> str:
    """The user as the API server named it, with the groups that carry rights (not the ones everybody has)."""
    own_groups = [group for group in groups if group not in ("system:authenticated",)]
    return f"user {user}" + (f" (groups {', '.join(own_groups)})" if own_groups else "")


def denied_message(user: str, groups: Sequence[str], kubeconfig: str, denied: Sequence[Check],
                   needed_by: Mapping[Check, Sequence[str]], reasons: Mapping[Check, str]) -> str:
    """Every missing permission, one per line, with the role that needs it and the authorizer's reason if it gave one."""
    lines = [f"{who(user, groups)} of {kubeconfig} lacks {len(denied)} permission(s) the run needs "
             "(SelfSubjectAccessReview, checked before any change):"]
    for check in denied:
        line = f"  - {describe_check(check)}"
        if needed_by.get(check):
            line += f" (needed by {', '.join(needed_by[check])})"
        if reasons.get(check):
            line += f": {reasons[check]}"
        lines.append(line)
    lines.append("Grant these to the user (a ClusterRole or Role and its binding), or use a kubeconfig whose user has "
                 "them.")
    return "\n".join(lines)


def where(kubeconfig: str, cluster: str, server: str) -> str:
    return f"{kubeconfig} (cluster {cluster}, server {server})"


def certificate_problem(user: str, kubeconfig: str, not_before: datetime.datetime, not_after: datetime.datetime,
                        now: datetime.datetime) -> Optional[str]:
    """Why the client certificate cannot authenticate now, or None while it is valid."""
    if now > not_after:
        return (f"the client certificate of user {user} in {kubeconfig} expired on {_utc(not_after)} (the API server "
                "refuses an expired certificate): renew it, or use a kubeconfig with a valid one")
    if now < not_before:
        return (f"the client certificate of user {user} in {kubeconfig} is not valid before {_utc(not_before)}: the "
                "API server refuses it (check this machine's clock, or the certificate)")
    return None


def _utc(moment: datetime.datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def transport_reason(error: str, kubeconfig: str, cluster: str, server: str) -> str:
    """A failed connection or TLS handshake (the text of urllib3's error) as one plain sentence."""
    text = error.lower()
    place = where(kubeconfig, cluster, server)
    if "certificate verify failed" in text or "certificate_verify_failed" in text:
        if "hostname" in text or "doesn't match" in text or "ip address mismatch" in text:
            return (f"the server's certificate does not name the host of the server URL in {place}: "
                    "use the address the certificate was issued for")
        if "expired" in text:
            return f"the server's certificate has expired: {place}"
        return (f"the server's certificate is not signed by the CA in {place}: the kubeconfig's "
                "certificate-authority(-data) belongs to another cluster, or the server is not the one meant")
    if "wrong version number" in text or "unknown protocol" in text or "record layer failure" in text:
        return f"the server does not speak TLS at {server}: {place} (http:// where https:// is needed, or the wrong port)"
    if "certificate" in text or "tlsv1 alert" in text or "sslerror" in text or "ssl:" in text:
        return f"the TLS handshake with the server failed: {place}: {error}"
    if "connection refused" in text:
        return f"no API server answers at {server} (connection refused): {place}"
    if "name or service not known" in text or "nodename nor servname" in text or "temporary failure in name" in text:
        return f"the server's host name in {place} does not resolve"
    if "timed out" in text or "timeout" in text:
        return f"the API server at {server} did not answer in time: {place}"
    return f"cannot reach the API server: {place}: {error}"


def status_reason(status: int, user: str, kubeconfig: str, cluster: str, server: str, body: str = "") -> str:
    """A refused first request (GET /version) as one plain sentence."""
    place = where(kubeconfig, cluster, server)
    if status == 401:
        return (f"the API server does not accept the credentials of user {user} in {place} (401 Unauthorized): a "
                "client certificate not signed by the cluster's client CA, or an invalid or expired token")
    if status == 403:
        return (f"user {user} is authenticated but may not even read the server's version in {place} (403 Forbidden): "
                f"{_message(body)}")
    return f"the API server answered {status} to GET /version: {place}: {_message(body)}"


def _message(body: str) -> str:
    import json

    try:
        return str(json.loads(body).get("message") or body)
    except (ValueError, AttributeError):
        return body.strip()[:300]
