"""Callback plugin: load the collection's filter plugins once, in the controller's main process.

Ansible runs every task of every host in a worker process forked from the main one, and templating (conditions,
arguments, ``vars/main.yml`` decisions) happens in that worker. A filter plugin of a collection is imported the first
time a worker uses it, and the collection loader compiles it (and the module_utils it imports) from source: what one
worker imported is gone when it exits, so every task pays again. Imported here, before the first fork, each worker
finds them in ``sys.modules``: measured on the lab (docs/testing.md, "Controller CPU"), a no-op ``nodes.yml`` on three
hosts went from 9.1 to 6.9 CPU seconds of the controller and ``site.yml --check`` from 43.5-48.2 to 37.7-38.6.
"""

from __future__ import annotations

DOCUMENTATION = """
name: preload
type: aggregate
short_description: Import the collection's filter plugins in the main process, before workers fork.
description:
  - Each task runs in a worker process forked from the controller's main process; a collection's filter imported
    there is compiled again by every worker that uses it. Imported once here, every worker inherits it.
  - Prints nothing and changes nothing in a run's results; a plugin that fails to import is left for the worker to
    report as it would without this callback.
requirements:
  - enable in configuration (callbacks_enabled)
"""

import importlib
import pkgutil
from typing import List

from ansible.plugins.callback import CallbackBase

PACKAGES = ("ansible_collections.gpu_ops.cluster.plugins.filter",)


def preload(packages=PACKAGES) -> List[str]:
    """Import every Python module of the given plugin packages; the names imported."""
    loaded = []
    for name in packages:
        try:
            package = importlib.import_module(name)
        except ImportError:
            continue
        for module in pkgutil.iter_modules(package.__path__):
            try:
                importlib.import_module("%s.%s" % (name, module.name))
            except Exception:  # pylint: disable=broad-except
                # The worker that uses it imports it again and reports the error where the task can name it.
                continue
            loaded.append("%s.%s" % (name, module.name))
    return loaded


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpu_ops.cluster.preload"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loaded = preload()
