# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""The API server connection options every module of this collection that talks to Kubernetes takes, documented
once (as kubernetes.core's k8s_auth_options). Their argument spec is AUTH_ARGSPEC in module_utils/k8s_raw.py."""

from __future__ import absolute_import, annotations, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  kubeconfig:
    description:
      - Path of the kubeconfig. The client's default (C(KUBECONFIG), C(~/.kube/config)) when omitted.
    type: path
  context:
    description:
      - Context of the kubeconfig to use. Its current context when omitted.
    type: str
requirements:
  - The C(kubernetes) Python client on the host that runs the module.
"""
