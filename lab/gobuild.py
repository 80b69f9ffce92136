"""Build the lab's Go binaries from their source, once per pinned version: the control plane (kube-apiserver & co.,
etcd, kwok, Kueue) for `labctl build`/`up`, NVIDIA's container toolkit for `labctl mirror`, containerd 2.x for
`labctl containerd2`, promtool (Prometheus 3.x) for `labctl promtool`, and the unit tests' oracles, programs of ours
built against upstream modules: the CDI spec loader (`labctl cdi-validate`), the device plugin's config loader
(`labctl device-plugin-config`), go-nvml's MIG mocks printed as JSON (`labctl nvml-mig-mocks`) and Kueue's
ClusterQueue webhook validation (`labctl kueue-validate`). Modules read but not built (the Prometheus
Operator's CRDs) come the same way: `module_source`.

Each component is a tiny Go module of ours under lab/go/<component>/ whose go.mod pins the upstream release (and,
for Kubernetes, replaces every staging module with its published v0.x twin) and names the upstream commands as
`tool` lines (or holds a small main package of ours, its *.go files part of the build's digest); go.sum pins every
byte. `go build` fetches through the Go module proxy. Modules and the build cache live
under $GPU_LAB_CACHE/go so every build after the first is incremental, and finished binaries are kept in
$GPU_LAB_CACHE/bin/<component>-<version>-<digest>/ and reused until go.mod, go.sum, Go or the flags change.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Mapping, Sequence

from _common import (
    Heartbeat,
    LabError,
    Stopwatch,
    cache_root,
    file_lock,
    format_seconds,
    log,
    run,
    sha256_bytes,
    stream,
)

ROOT = Path(__file__).resolve().parents[1]
GO_DIR = ROOT / "lab" / "go"
RECIPE_VERSION = 1
COMPLETE_STAMP = ".complete"


@dataclasses.dataclass(frozen=True)
class Component:
    name: str
    module: str  # the upstream module whose version names the build
    packages: tuple[str, ...]  # upstream main packages, listed as `tool` lines in our go.mod (or our own module's)
    binaries: tuple[str, ...]  # file names the packages build to, same order
    # -X flags; "{version}" (v1.2.3), "{semver}" (1.2.3), "{major}", "{minor}", "{release}" (release_version)
    version_ldflags: tuple[str, ...] = ()
    extra_ldflags: tuple[str, ...] = ()  # passed to the linker as they are (after -s -w)
    tags: tuple[str, ...] = ()  # go build -tags
    cgo: bool | None = None  # CGO_ENABLED; None leaves Go's default

    @property
    def source_dir(self) -> Path:
        return GO_DIR / self.name


_K8S_VERSION_PKG = "k8s.io/component-base/version"


def _containerd(name: str) -> Component:
    """containerd's daemon, one release line per component; the pin is lab/go/<name>/go.mod's."""
    return Component(
        name=name,
        module="github.com/containerd/containerd/v2",
        packages=("github.com/containerd/containerd/v2/cmd/containerd",),
        binaries=("containerd",),
        version_ldflags=("github.com/containerd/containerd/v2/version.Version={version}",),
        tags=("urfave_cli_no_docs", "no_btrfs"),
        cgo=False,
    )


def _oracle(name: str, module: str, binary: str, cgo: bool = False) -> Component:
    """A program of ours (main package gpu-lab/<binary> in lab/go/<name>) built against `module`, for the unit tests."""
    return Component(name=name, module=module, packages=(f"gpu-lab/{binary}",), binaries=(binary,), cgo=cgo)


_NCT_COMMANDS = ("nvidia-ctk", "nvidia-container-runtime", "nvidia-cdi-hook", "nvidia-container-runtime-hook")

COMPONENTS: dict[str, Component] = {
    # kwok shares this module: one `go build` compiles client-go & co. once for all four commands (kwok's own pin,
    # v0.8.0, builds against the v0.37 libraries), which saves minutes on a new machine.
    "kubernetes": Component(
        name="kubernetes",
        module="k8s.io/kubernetes",
        packages=(
            "k8s.io/kubernetes/cmd/kube-apiserver",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
            "k8s.io/kubernetes/cmd/kube-scheduler",
            "sigs.k8s.io/kwok/cmd/kwok",
        ),
        binaries=("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"),
        # Without these the binaries call themselves v0.0.0-master and clients warn about version skew.
        version_ldflags=(
            f"{_K8S_VERSION_PKG}.gitVersion={{version}}",
            f"{_K8S_VERSION_PKG}.gitMajor={{major}}",
            f"{_K8S_VERSION_PKG}.gitMinor={{minor}}",
            f"{_K8S_VERSION_PKG}.gitTreeState=clean",
        ),
    ),
    "etcd": Component(
        name="etcd",
        module="go.etcd.io/etcd/server/v3",
        packages=("go.etcd.io/etcd/server/v3",),
        binaries=("etcd",),
    ),
    # NVIDIA's container toolkit, packaged by `labctl mirror` into the flat libnvidia-container repository. cgo stays
    # on (go-nvml dlopens libnvidia-ml); NVML's symbols resolve at run time, as upstream's Makefile links them.
    "nvidia-container-toolkit": Component(
        name="nvidia-container-toolkit",
        module="github.com/NVIDIA/nvidia-container-toolkit",
        packages=tuple(f"github.com/NVIDIA/nvidia-container-toolkit/cmd/{name}" for name in _NCT_COMMANDS),
        binaries=_NCT_COMMANDS,
        version_ldflags=("github.com/NVIDIA/nvidia-container-toolkit/internal/info.version={semver}",),
        extra_ldflags=("'-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files "
                       "-Wl,-z,lazy'",),
        cgo=True,
    ),
    # containerd 2.x for the toolkit role's checks (`containerd config dump`): static, so it runs on any test host;
    # without cgo the btrfs snapshotter drops out, the tag says so explicitly. Two release lines, each its own module
    # (their dependency graphs differ): 2.2 (config version 3) and 2.4 (config version 4, since 2.3).
    "containerd": _containerd("containerd"),
    "containerd-2.3": _containerd("containerd-2.3"),
    "containerd-2.4": _containerd("containerd-2.4"),
    # Kueue's controller manager, run by lab/controller_runner.py for the gpu_queues role's Deployment (kwok runs no
    # container). Its own module: Kueue v0.17 builds against the v0.35 Kubernetes libraries, not the lab's v0.37.
    "kueue": Component(
        name="kueue",
        module="sigs.k8s.io/kueue",
        packages=("sigs.k8s.io/kueue/cmd/kueue",),
        binaries=("kueue",),
        version_ldflags=("sigs.k8s.io/kueue/pkg/version.GitVersion={version}",),
        cgo=False,
    ),
    # promtool of the Prometheus line the prometheus role runs (3.x), for the rule and configuration checks of the
    # tests (`labctl promtool`). The module's v0.3XX.Y is Prometheus 3.XX.Y ("{release}" below); no cgo.
    "promtool": Component(
        name="promtool",
        module="github.com/prometheus/prometheus",
        packages=("github.com/prometheus/prometheus/cmd/promtool",),
        binaries=("promtool",),
        version_ldflags=("github.com/prometheus/common/version.Version={release}",
                         "github.com/prometheus/common/version.Branch=release",
                         "github.com/prometheus/common/version.Revision=gpu-lab-go-build"),
        cgo=False,
    ),
    # The unit tests' oracles: programs of ours (lab/go/<name>/main.go) built against an upstream module.
    # CDI specs read by the CNCF container-device-interface module's own loader (pkg/cdi.ReadSpec).
    "cdi-validate": _oracle("cdi-validate", "tags.cncf.io/container-device-interface", "cdi-validate"),
    # The device plugin's config loader (k8s-device-plugin api/config/v1), run on every device plugin config the
    # project writes or accepts. No cgo: the loader needs no NVML.
    "device-plugin-config": _oracle("device-plugin-config", "github.com/NVIDIA/k8s-device-plugin",
                                    "device-plugin-config-check"),
    # What NVIDIA's go-nvml mock servers dgxa100, dgxh100, dgxh200 and dgxb200 answer through the NVML interface (GPU
    # and compute instance profiles, placements, PCI device id) as JSON, for tests/unit/test_mig_oracle.py. cgo on:
    # go-nvml's nvml package is cgo (nothing is dlopened here).
    "nvml-mig-mocks": _oracle("nvml-mig-mocks", "github.com/NVIDIA/go-nvml", "nvml-mig-mocks", cgo=True),
    # Kueue's own ClusterQueue validation (pkg/webhooks ValidateClusterQueue, what its admission webhook runs on create
    # and update) on the queues the gpu_queues role renders, for tests/unit/test_kueue_oracle.py. The same pins as the
    # kueue component (its go.mod and go.sum, the tool line left out), so the build cache it filled serves this one.
    "kueue-validate": _oracle("kueue-validate", "sigs.k8s.io/kueue", "kueue-validate"),
}
# What `labctl build` / `up` need; the others are built by the commands that use them (mirror, containerd2, promtool,
# the oracles' commands) or all at once by `labctl build --tools` (what `make test` starts first).
CONTROL_PLANE = ("kubernetes", "etcd", "kueue")


def pinned_version(go_mod: str, module: str) -> str:
    """The version go.mod requires for module (direct or indirect)."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod, re.MULTILINE)
    if match is None:
        raise LabError(f"go.mod does not require {module}")
    return match.group(1)


def release_version(version: str) -> str:
    """The release a Go module version stands for: Prometheus publishes 3.XX.Y as module version v0.3XX.Y (its Go
    module never left v0); any other version is its semver."""
    match = re.fullmatch(r"v0\.([1-9])([0-9]{2})\.([0-9]+)", version)
    if match is None:
        return version.lstrip("v")
    return f"{match.group(1)}.{int(match.group(2))}.{match.group(3)}"


def ldflags(component: Component, version: str) -> str:
    semver = version.lstrip("v")
    major, minor = (semver.split(".") + ["0", "0"])[:2]
    flags = ["-s", "-w", *component.extra_ldflags]
    for flag in component.version_ldflags:
        flags += ["-X", flag.format(version=version, semver=semver, major=major, minor=minor,
                                    release=release_version(version))]
    return " ".join(flags)


def build_settings(component: Component, version: str) -> str:
    """Everything besides go.mod/go.sum/Go that changes the binaries; the ldflags alone for the older components,
    so their cached builds keep their digests."""
    settings = ldflags(component, version)
    if component.tags:
        settings += " tags=" + ",".join(component.tags)
    if component.cgo is not None:
        settings += f" cgo={int(component.cgo)}"
    return settings


def build_command(go: str, component: Component, version: str, out_dir: Path) -> list[str]:
    cmd = [go, "build", "-v", "-trimpath", "-ldflags", ldflags(component, version)]
    if component.tags:
        cmd += ["-tags", ",".join(component.tags)]
    return [*cmd, "-o", str(out_dir) + "/", *component.packages]


def go_output_name(package: str) -> str:
    """The file `go build -o DIR/` writes for a main package: its last path element, skipping a /vN suffix."""
    parts = package.rstrip("/").split("/")
    if len(parts) > 1 and re.fullmatch(r"v[0-9]+", parts[-1]):
        return parts[-2]
    return parts[-1]


def build_digest(go_mod: bytes, go_sum: bytes, go_version: str, flags: str, sources: bytes = b"") -> str:
    parts = [str(RECIPE_VERSION).encode(), go_mod, go_sum, go_version.encode(), flags.encode()]
    if sources:  # only components with Go code of ours: the others keep their cached builds' digests
        parts.append(sources)
    return sha256_bytes(b"\0".join(parts))[:12]


def own_sources(source_dir: Path) -> bytes:
    """Our own Go files in a component's directory (name and content), in a fixed order; b"" when it has none."""
    return b"\0".join(path.name.encode() + b"\0" + path.read_bytes() for path in sorted(source_dir.glob("*.go")))


def go_env(root: Path) -> dict[str, str]:
    """Caches under the lab's cache root, read-only module graph (go.sum must already hold every hash)."""
    env = {
        "GOMODCACHE": str(root / "go" / "mod"),
        "GOCACHE": str(root / "go" / "build"),
        "GOFLAGS": "-mod=readonly -buildvcs=false",
    }
    if "GOPROXY" not in os.environ:
        env["GOPROXY"] = "https://proxy.golang.org"
    return env


def go_binary() -> str:
    found = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if found is None:
        raise LabError("the Go toolchain is missing (expected `go` on PATH or /usr/local/go/bin/go); the lab builds "
                       "kube-apiserver, etcd, kwok, NVIDIA's container toolkit and containerd from source with it")
    return found


@dataclasses.dataclass(frozen=True)
class Build:
    component: Component
    version: str
    directory: Path

    def binary(self, name: str) -> Path:
        return self.directory / name


def planned_build(component: Component, root: Path, go_version: str) -> Build:
    go_mod = (component.source_dir / "go.mod").read_bytes()
    go_sum = (component.source_dir / "go.sum").read_bytes()
    version = pinned_version(go_mod.decode(), component.module)
    digest = build_digest(go_mod, go_sum, go_version, build_settings(component, version),
                          own_sources(component.source_dir))
    return Build(component, version, root / "bin" / f"{component.name}-{version}-{digest}")


def is_build_of(directory_name: str, component_name: str) -> bool:
    """Whether a directory under bin/ is a (finished or partial) build of that component: <name>-v<version>-<digest>.
    Exact, since one component's name may begin another's (containerd, containerd-2.4)."""
    pattern = rf"{re.escape(component_name)}-v[0-9][^/]*-[0-9a-f]{{12}}(?:\.partial)?"
    return re.fullmatch(pattern, directory_name) is not None


def is_complete(build: Build) -> bool:
    return (build.directory / COMPLETE_STAMP).is_file() and all(
        build.binary(name).is_file() for name in build.component.binaries
    )


class _Progress:
    """Counts the packages `go build -v` reports while it compiles them."""

    def __init__(self) -> None:
        self.packages = 0
        self.downloads = 0
        self.last = ""
        self._lock = threading.Lock()

    def feed(self, line: str) -> None:
        with self._lock:
            if line.startswith("go: downloading"):
                self.downloads += 1
            elif line and not line.startswith(("go:", "#", " ", "\t")):
                self.packages += 1
                self.last = line.strip()

    def message(self, timer: Stopwatch) -> str:
        with self._lock:
            return (f"still building: {self.packages} packages compiled, {self.downloads} modules fetched "
                    f"({format_seconds(timer.elapsed)}; last {self.last or '-'})")


def build_component(component: Component, root: Path, go: str, go_version: str) -> Build:
    build = planned_build(component, root, go_version)
    if is_complete(build):
        return build
    # `make test` starts every build at once, first thing, while a lane or a helper may ask for the same one: the
    # second caller waits for the first and then finds the build complete.
    with file_lock(root / "locks" / f"go-build-{component.name}.lock", f"the {component.name} build"):
        if is_complete(build):
            return build
        return _build_locked(component, build, root, go)


def _build_locked(component: Component, build: Build, root: Path, go: str) -> Build:
    staging = build.directory.with_name(build.directory.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"go-build-{component.name}.log"
    progress = _Progress()
    timer = Stopwatch()
    log(f"building {', '.join(component.binaries)} {build.version} from source (log {log_path}); "
        "the first build on a new machine takes several minutes", component.name)
    cmd = build_command(go, component, build.version, staging)
    env = go_env(root)
    if component.cgo is not None:
        env["CGO_ENABLED"] = "1" if component.cgo else "0"
    with Heartbeat(lambda: progress.message(timer), component.name, every=30.0):
        try:
            stream(cmd, progress.feed, log_path=log_path, env=env, cwd=component.source_dir)
        except LabError as exc:
            raise LabError(f"building {component.name} {build.version} failed: {exc}") from exc
    for package, name in zip(component.packages, component.binaries):
        produced = staging / go_output_name(package)
        if not produced.is_file():
            raise LabError(f"building {component.name}: `go build` did not produce {produced.name}; see {log_path}")
        produced.rename(staging / name)
    (staging / COMPLETE_STAMP).write_text(f"{build.version}\n")
    shutil.rmtree(build.directory, ignore_errors=True)
    staging.rename(build.directory)
    for stale in build.directory.parent.iterdir():
        if stale != build.directory and is_build_of(stale.name, component.name):
            shutil.rmtree(stale, ignore_errors=True)  # an older pin: keep one build per component
    log(f"built {build.version} in {format_seconds(timer.elapsed)} "
        f"({progress.packages} packages compiled) -> {build.directory}", component.name)
    return build


def ensure_builds(names: Sequence[str] | None = None, root: Path | None = None) -> Mapping[str, Build]:
    """Every component built (or found in the cache), in a fixed order so logs read the same each time."""
    root = cache_root() if root is None else root
    go = go_binary()
    go_version = run([go, "env", "GOVERSION"]).stdout.strip()
    wanted = list(names or CONTROL_PLANE)
    # Built side by side: while one links (a single core, tens of seconds) the other compiles.
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(wanted)) as pool:
        futures = {name: pool.submit(build_component, COMPONENTS[name], root, go, go_version) for name in wanted}
        return {name: future.result() for name, future in futures.items()}


def cached_builds(root: Path | None = None) -> Mapping[str, Build]:
    """The builds `up` would use, without building; raises when one is missing."""
    root = cache_root() if root is None else root
    go_version = run([go_binary(), "env", "GOVERSION"]).stdout.strip()
    builds = {name: planned_build(COMPONENTS[name], root, go_version) for name in CONTROL_PLANE}
    missing = [name for name, build in builds.items() if not is_complete(build)]
    if missing:
        raise LabError(f"not built yet: {', '.join(missing)}; run `labctl build` (or `labctl up`, which builds)")
    return builds


# Go modules whose source the lab reads but never builds (lab/go/<name>/ pins each the same way: go.mod and go.sum).
SOURCES: dict[str, str] = {
    # The Prometheus Operator's CRDs (example/prometheus-operator-crd/), installed on the lab by the monitoring tests.
    "prometheus-operator": "github.com/prometheus-operator/prometheus-operator",
}


def module_source(name: str, root: Path | None = None) -> Path:
    """The unpacked source of a pinned module (SOURCES, or the upstream module of a component: its published files),
    fetched once through the Go module proxy into the module cache and checked against our go.sum
    (GOFLAGS=-mod=readonly: a zip whose hash differs is refused)."""
    import json

    root = cache_root() if root is None else root
    source_dir = GO_DIR / name
    module = SOURCES[name] if name in SOURCES else COMPONENTS[name].module
    version = pinned_version((source_dir / "go.mod").read_text(encoding="utf-8"), module)
    result = run([go_binary(), "mod", "download", "-json", f"{module}@{version}"], cwd=source_dir,
                 env=go_env(root))
    answer = json.loads(result.stdout)
    if answer.get("Error"):
        raise LabError(f"fetching {module} {version}: {answer['Error']}")
    return Path(answer["Dir"])
