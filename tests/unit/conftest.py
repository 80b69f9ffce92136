"""Make the collection's plugins importable in plain pytest by their collection names, as Ansible resolves them.

The checkout is the collection gpu_ops.cluster; `make setup` links it into the virtualenv's ansible_collections, so
`ansible_collections.gpu_ops.cluster.plugins.module_utils.<name>` imports as it does on a host. Modules and filters
load from that path as fresh modules. AnsibleModule.exit_json/fail_json are patched to raise (as kubernetes.core's
tests/unit/utils/ansible_module_mock.py does) so a test can catch the result of main().
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, Iterator, List, Optional

import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

REPO_ROOT = Path(__file__).resolve().parents[2]
COLLECTION = "ansible_collections.gpu_ops.cluster"


def collection_root() -> Path:
    """Where Python finds the collection: the checkout itself, through the link `make setup` made."""
    try:
        import ansible_collections.gpu_ops.cluster as collection
    except ImportError:
        collection = None
    paths = list(getattr(collection, "__path__", []))
    if not paths or Path(paths[0]).resolve() != REPO_ROOT:
        pytest.exit(f"{COLLECTION} does not resolve to {REPO_ROOT} ({paths or 'not importable'}): run `make setup`, "
                    "which links the checkout into the virtualenv's ansible_collections", returncode=4)
    return Path(paths[0])


COLLECTION_ROOT = collection_root()


def load_source(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_ansible_module(name: str) -> ModuleType:
    """plugins/modules/<name>.py as a fresh module under its collection name."""
    return load_source(f"{COLLECTION}.plugins.modules.{name}", COLLECTION_ROOT / "plugins" / "modules" / f"{name}.py")


def load_filter_plugin(name: str) -> ModuleType:
    """plugins/filter/<name>.py as a module (filters are plain functions; Ansible only maps names to them)."""
    return load_source(f"{COLLECTION}.plugins.filter.{name}", COLLECTION_ROOT / "plugins" / "filter" / f"{name}.py")


def render_role_template(role: str, template: str, **overrides: Any) -> str:
    """roles/<role>/templates/<template> rendered by Ansible's own templar with the role's defaults and vars (and
    overrides); lookups that need a play (the role's own `lookup('template')` vars) are left unresolved."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    loader = DataLoader()
    variables: Dict[str, Any] = {"ansible_managed": "Ansible managed"}
    for path in (REPO_ROOT / "roles" / role / "defaults" / "main.yml", REPO_ROOT / "roles" / role / "vars" / "main.yml"):
        if path.exists():
            variables.update(loader.load_from_file(str(path), trusted_as_template=True) or {})
    variables.update(overrides)
    source = (REPO_ROOT / "roles" / role / "templates" / template).read_text(encoding="utf-8")
    return Templar(loader=loader, variables=variables).template(trust_as_template(source))


def promtool_path() -> Path:
    """promtool from `labctl promtool` (lab/_common.py says where; $PROMTOOL overrides); missing fails the test."""
    sys.path.insert(0, str(REPO_ROOT / "lab"))
    from _common import promtool_path as lab_promtool_path

    path = lab_promtool_path()
    if not path.exists():
        pytest.fail(f"promtool not found at {path}: run `lab/labctl.py promtool` (make unit does) or set PROMTOOL")
    return path


def nvml_mig_mocks() -> Dict[str, Any]:
    """What NVIDIA's go-nvml MIG mocks answer, as JSON from `labctl nvml-mig-mocks`'s program (lab/_common.py says
    where; $NVML_MIG_MOCKS overrides); a missing program fails the test."""
    import json
    import subprocess

    sys.path.insert(0, str(REPO_ROOT / "lab"))
    from _common import nvml_mig_mocks_path

    path = nvml_mig_mocks_path()
    if not path.exists():
        pytest.fail(f"{path} not found: run `lab/labctl.py nvml-mig-mocks` (make unit does) or set NVML_MIG_MOCKS")
    answer = subprocess.run([str(path)], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(answer.stdout)


class AnsibleExitJson(Exception):
    """main() called exit_json; args[0] holds the result, args[1] the module's check_mode."""

    @property
    def result(self) -> Dict[str, Any]:
        return self.args[0]


class AnsibleFailJson(Exception):
    """main() called fail_json; args[0] holds the result."""

    @property
    def result(self) -> Dict[str, Any]:
        return self.args[0]


def exit_json(self: basic.AnsibleModule, **kwargs: Any) -> None:
    kwargs.setdefault("changed", False)
    raise AnsibleExitJson(kwargs, self.check_mode)


def fail_json(self: basic.AnsibleModule, **kwargs: Any) -> None:
    kwargs["failed"] = True
    raise AnsibleFailJson(kwargs)


class ModuleRunner:
    """Runs a module's main() with given args and returns what it passed to exit_json."""

    def __init__(self, module: ModuleType, warnings: List[str]) -> None:
        self.module = module
        self.warnings = warnings
        self.ran_in_check_mode: Optional[bool] = None

    def exit(self, args: Optional[Dict[str, Any]] = None, check_mode: bool = False) -> Dict[str, Any]:
        module_args = dict(args or {})
        if check_mode:
            module_args["_ansible_check_mode"] = True
        with patch_module_args(module_args), pytest.raises(AnsibleExitJson) as exited:
            self.module.main()
        self.ran_in_check_mode = exited.value.args[1]
        return exited.value.result

    def fail(self, args: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        with patch_module_args(dict(args or {})), pytest.raises(AnsibleFailJson) as failed:
            self.module.main()
        return failed.value.result


@pytest.fixture
def patched_ansible_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[List[str]]:
    """Patch AnsibleModule to raise on exit/fail; yields the list that collects module.warn() messages."""
    warnings: List[str] = []
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, warning, **kwargs: warnings.append(warning))
    yield warnings


@pytest.fixture
def nvidia_driver_info(patched_ansible_module: List[str]) -> ModuleRunner:
    return ModuleRunner(load_ansible_module("nvidia_driver_info"), patched_ansible_module)


def install_collection_loader() -> None:
    """Ansible's collection loader, so that the roles' FQCN filters (gpu_ops.cluster.*) resolve as in a play.

    This conftest imported the collection as a plain namespace package (without the loader's metadata); those module
    entries go, and the loader imports the collection again from the same files. Test modules keep what they loaded.
    """
    from ansible.plugins.loader import init_plugin_loader
    from ansible.utils.collection_loader import AnsibleCollectionConfig

    if AnsibleCollectionConfig.collection_finder is not None:
        return
    for name in [name for name in sys.modules if name == "ansible_collections" or name.startswith("ansible_collections.")]:
        del sys.modules[name]
    init_plugin_loader([str(COLLECTION_ROOT.parents[2])])
