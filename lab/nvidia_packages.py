"""The .deb packages of the lab mirror's NVIDIA-style flat repositories, and how to build them.

Two kinds, kept apart and named for what they are:

- real: nvidia-container-toolkit-base and nvidia-container-toolkit hold the binaries gobuild.py compiled from NVIDIA's
  Go source (github.com/NVIDIA/nvidia-container-toolkit, version pinned in lab/go/nvidia-container-toolkit/go.mod);
- lab doubles: libnvidia-container1 / libnvidia-container-tools (C code on GitHub, unreachable here),
  cuda-toolkit-X-Y and the driver packages of both naming schemes (cuda-drivers-580 / nvidia-open-580 before branch
  590; cuda-drivers / nvidia-open with nvidia-driver-pinning-590 from 590), from NVIDIA's CUDA repository, unreachable
  here. They carry upstream's package names and versions so
  dependencies and version pins resolve as they would against NVIDIA's repositories; every Description starts with
  "gpu-lab double:".

Package definitions are pure data (unit-tested); build_deb() turns one into a reproducible .deb with dpkg-deb.
Standard library only, like the rest of `labctl mirror`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

from _common import LabError, run, sha256_bytes

# Every file and the ar/tar members get this mtime (SOURCE_DATE_EPOCH), so the same inputs give the same .deb bytes.
SOURCE_DATE_EPOCH = 1735689600  # 2025-01-01T00:00:00Z
MAINTAINER = "gpu-lab"
ARCHITECTURE = "amd64"
DOUBLE_PREFIX = "gpu-lab double:"
DEB_REVISION = "1"  # NVIDIA's packages are <upstream version>-1


@dataclasses.dataclass(frozen=True)
class PackageFile:
    path: str  # absolute path on the installed system
    data: bytes
    mode: int = 0o644
    conffile: bool = False


@dataclasses.dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    section: str
    summary: str
    description: str  # long description: paragraphs separated by blank lines
    files: tuple[PackageFile, ...]
    depends: tuple[str, ...] = ()
    breaks: tuple[str, ...] = ()
    replaces: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    homepage: str = ""
    scripts: tuple[tuple[str, str], ...] = ()  # (maintainer script name, text)

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version.replace(':', '%3a')}_{ARCHITECTURE}.deb"


def installed_size_kib(files: Sequence[PackageFile]) -> int:
    """Installed-Size as dpkg-gencontrol counts it: each file rounded up to a KiB."""
    return sum(-(-len(item.data) // 1024) for item in files) or 1


def render_description(summary: str, text: str) -> str:
    """The Description field: summary line, then the long text indented, blank lines as ' .'."""
    lines = [f"Description: {summary}"]
    for paragraph_line in text.strip("\n").splitlines():
        lines.append(f" {paragraph_line}" if paragraph_line.strip() else " .")
    return "\n".join(lines)


def render_control(package: DebPackage) -> str:
    fields = [
        ("Package", package.name),
        ("Version", package.version),
        ("Architecture", ARCHITECTURE),
        ("Maintainer", MAINTAINER),
        ("Installed-Size", str(installed_size_kib(package.files))),
        ("Depends", ", ".join(package.depends)),
        ("Breaks", ", ".join(package.breaks)),
        ("Conflicts", ", ".join(package.conflicts)),
        ("Provides", ", ".join(package.provides)),
        ("Replaces", ", ".join(package.replaces)),
        ("Section", package.section),
        ("Priority", "optional"),
        ("Homepage", package.homepage),
    ]
    lines = [f"{key}: {value}" for key, value in fields if value]
    return "\n".join(lines) + "\n" + render_description(package.summary, package.description) + "\n"


def package_digest(package: DebPackage) -> str:
    """sha256 over everything that decides the .deb's bytes."""
    document = {
        "epoch": SOURCE_DATE_EPOCH,
        "control": render_control(package),
        "files": sorted([f.path, f.mode, f.conffile, sha256_bytes(f.data)] for f in package.files),
        "scripts": sorted([name, sha256_bytes(text.encode())] for name, text in package.scripts),
    }
    return sha256_bytes(json.dumps(document, sort_keys=True).encode("utf-8"))


def stage_tree(package: DebPackage, root: Path) -> None:
    """Write the package's file tree and DEBIAN/ metadata under root, every mtime at SOURCE_DATE_EPOCH."""
    control_dir = root / "DEBIAN"
    control_dir.mkdir(parents=True)
    (control_dir / "control").write_text(render_control(package), encoding="utf-8")
    conffiles = [item.path for item in package.files if item.conffile]
    if conffiles:
        (control_dir / "conffiles").write_text("\n".join(conffiles) + "\n", encoding="utf-8")
    for name, text in package.scripts:
        (control_dir / name).write_text(text, encoding="utf-8")
        os.chmod(control_dir / name, 0o755)
    for item in package.files:
        target = root / item.path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(item.data)
        os.chmod(target, item.mode)
    for directory, subdirs, names in os.walk(root):
        os.chmod(directory, 0o755)
        for name in [*subdirs, *names]:
            os.utime(Path(directory) / name, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))
    os.utime(root, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))


def build_deb(package: DebPackage, out_dir: Path) -> Path:
    """dpkg-deb --build --root-owner-group with SOURCE_DATE_EPOCH: identical inputs give an identical file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / package.filename
    with tempfile.TemporaryDirectory(prefix=f".build-{package.name}-", dir=out_dir) as scratch:
        root = Path(scratch) / "root"
        stage_tree(package, root)
        partial = Path(scratch) / package.filename
        try:
            run(["dpkg-deb", "--build", "--root-owner-group", "-Zxz", str(root), str(partial)],
                env={"SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)})
        except LabError as exc:
            raise LabError(f"building {package.filename} failed: {exc}") from exc
        os.replace(partial, target)
    return target


# --------------------------------------------------------------------------------------
# NVIDIA container toolkit: the real Go build, packaged as upstream splits it
# --------------------------------------------------------------------------------------

TOOLKIT_HOMEPAGE = "https://github.com/NVIDIA/nvidia-container-toolkit"
TOOLKIT_BASE_BINARIES = ("nvidia-ctk", "nvidia-container-runtime", "nvidia-cdi-hook")
TOOLKIT_HOOK_BINARY = "nvidia-container-runtime-hook"
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
# Package relations as NVIDIA's 1.18 packages declare them (packaging/debian/control upstream).
TOOLKIT_BREAKS = ("nvidia-container-runtime (<= 3.5.0-1)", "nvidia-container-runtime-hook")
TOOLKIT_BASE_BREAKS = (*TOOLKIT_BREAKS, "nvidia-container-toolkit (<= 1.10.0-1)")
_GLIBC_VERSION = re.compile(rb"GLIBC_(2\.[0-9]+(?:\.[0-9]+)?)\0")


def deb_version(go_version: str) -> str:
    """v1.20.2 (go.mod) -> 1.20.2-1 (NVIDIA's package version)."""
    if not re.fullmatch(r"v[0-9]+\.[0-9]+\.[0-9]+", go_version):
        raise LabError(f"unexpected toolkit version {go_version!r} in go.mod (wanted vX.Y.Z)")
    return f"{go_version[1:]}-{DEB_REVISION}"


def libc_dependency(binaries: Sequence[bytes]) -> tuple[str, ...]:
    """`libc6 (>= 2.N)` for the newest glibc symbol version the (cgo) binaries need; () for static ones."""
    found = {match.decode() for data in binaries for match in _GLIBC_VERSION.findall(data)}
    if not found:
        return ()
    newest = max(found, key=lambda text: tuple(int(part) for part in text.split(".")))
    return (f"libc6 (>= {newest})",)


def toolkit_dependencies(version: str) -> tuple[str, ...]:
    """nvidia-container-toolkit's Depends on its siblings (upstream pins the base exactly, the tools within 1.x)."""
    return (
        f"nvidia-container-toolkit-base (= {version})",
        f"libnvidia-container-tools (>= {version})",
        "libnvidia-container-tools (<< 2.0.0)",
    )


def toolkit_packages(go_version: str, binaries: Mapping[str, bytes], config_toml: bytes) -> list[DebPackage]:
    """nvidia-container-toolkit-base and nvidia-container-toolkit from the gobuild binaries."""
    version = deb_version(go_version)
    missing = [name for name in (*TOOLKIT_BASE_BINARIES, TOOLKIT_HOOK_BINARY) if name not in binaries]
    if missing:
        raise LabError(f"the toolkit build lacks {', '.join(missing)}")
    source_note = (f"Built by gpu-lab from NVIDIA's Go source, {TOOLKIT_HOMEPAGE} {go_version},\n"
                   "with go build -trimpath -mod=readonly (lab/gobuild.py).")
    base_files = tuple(PackageFile(f"/usr/bin/{name}", binaries[name], 0o755) for name in TOOLKIT_BASE_BINARIES)
    base = DebPackage(
        name="nvidia-container-toolkit-base",
        version=version,
        section="utils",
        summary="NVIDIA container toolkit base: nvidia-ctk, nvidia-container-runtime, nvidia-cdi-hook",
        description=(f"The toolkit's command-line tool, OCI runtime wrapper and CDI hook, and\n"
                     f"{TOOLKIT_CONFIG} as `nvidia-ctk config default` writes it.\n\n{source_note}"),
        files=(*base_files, PackageFile(TOOLKIT_CONFIG, config_toml, 0o644, conffile=True)),
        depends=libc_dependency([binaries[name] for name in TOOLKIT_BASE_BINARIES]),
        breaks=TOOLKIT_BASE_BREAKS,
        replaces=TOOLKIT_BREAKS,
        homepage=TOOLKIT_HOMEPAGE,
    )
    hook = DebPackage(
        name="nvidia-container-toolkit",
        version=version,
        section="utils",
        summary="NVIDIA container toolkit: nvidia-container-runtime-hook",
        description=("The OCI prestart hook that hands GPUs to containers through nvidia-container-cli.\n\n"
                     + source_note),
        files=(PackageFile(f"/usr/bin/{TOOLKIT_HOOK_BINARY}", binaries[TOOLKIT_HOOK_BINARY], 0o755),),
        depends=(*toolkit_dependencies(version), *libc_dependency([binaries[TOOLKIT_HOOK_BINARY]])),
        breaks=TOOLKIT_BREAKS,
        replaces=TOOLKIT_BREAKS,
        homepage=TOOLKIT_HOMEPAGE,
    )
    return [base, hook]


# --------------------------------------------------------------------------------------
# libnvidia-container: lab doubles
# --------------------------------------------------------------------------------------


def build_date() -> str:
    return datetime.datetime.fromtimestamp(SOURCE_DATE_EPOCH, tz=datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M+00:00")


def nvidia_container_cli_script(version: str) -> str:
    """The double's nvidia-container-cli: `--version` as upstream prints it, anything else fails loudly."""
    upstream = version.split("-")[0]
    return f"""#!/bin/sh
# gpu-lab double of nvidia-container-cli (libnvidia-container is not reachable from the lab).
# It answers --version like the real tool and refuses everything else.
case "${{1:-}}" in
  --version|-V|version)
    cat <<'EOF'
cli-version: {upstream}
lib-version: {upstream}
build date: {build_date()}
build revision: gpu-lab-double
build platform: x86_64
EOF
    exit 0 ;;
esac
echo "nvidia-container-cli: this is the gpu-lab lab double; it cannot set up GPUs for containers" >&2
exit 1
"""


def libnvidia_container_packages(version: str) -> list[DebPackage]:
    readme = (f"libnvidia-container1 {version} in this package is a gpu-lab lab double: it holds no library.\n"
              "It exists so that NVIDIA's container toolkit packages resolve their dependencies in the lab.\n").encode()
    library = DebPackage(
        name="libnvidia-container1",
        version=version,
        section="libs",
        summary=f"{DOUBLE_PREFIX} placeholder for NVIDIA's container library",
        description=("Stands in for libnvidia-container1 in the gpu-lab mirror, where NVIDIA's\n"
                     "GitHub-hosted C sources cannot be fetched. Contains no library."),
        files=(PackageFile("/usr/share/doc/libnvidia-container1/README.gpu-lab-double", readme),),
    )
    tools = DebPackage(
        name="libnvidia-container-tools",
        version=version,
        section="utils",
        summary=f"{DOUBLE_PREFIX} nvidia-container-cli that only reports its version",
        description=("Stands in for libnvidia-container-tools in the gpu-lab mirror. Its\n"
                     "nvidia-container-cli answers --version in upstream's format and exits 1\n"
                     "for every other request, saying it is a lab double."),
        files=(PackageFile("/usr/bin/nvidia-container-cli", nvidia_container_cli_script(version).encode(), 0o755),),
        depends=(f"libnvidia-container1 (>= {version})",),
    )
    return [library, tools]


# --------------------------------------------------------------------------------------
# CUDA toolkit: lab doubles in NVIDIA's /usr/local/cuda-X.Y layout
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CudaRelease:
    version: str  # 12.8.1
    nvcc_version: str  # 12.8.93: what `nvcc --version` reports as V...
    compiler_build: str  # 35583870_0
    built_on: str  # as nvcc prints it
    copyright_year: int

    @property
    def series(self) -> str:  # 12.8
        return ".".join(self.version.split(".")[:2])

    @property
    def major(self) -> str:
        return self.version.split(".")[0]

    @property
    def package(self) -> str:  # cuda-toolkit-12-8
        return "cuda-toolkit-" + self.series.replace(".", "-")

    @property
    def prefix(self) -> str:  # /usr/local/cuda-12.8
        return f"/usr/local/cuda-{self.series}"

    @property
    def priority(self) -> int:  # 128, as NVIDIA's alternatives use
        return int(self.series.replace(".", ""))


# The numbers of NVIDIA's real releases (nvcc --version of 12.6 Update 3, 12.8 Update 1, 13.0 Update 2).
CUDA_RELEASES: dict[str, CudaRelease] = {
    release.package: release
    for release in (
        CudaRelease("12.6.3", "12.6.85", "35059454_0", "Tue_Oct_29_23:50:19_PDT_2024", 2024),
        CudaRelease("12.8.1", "12.8.93", "35583870_0", "Fri_Feb_21_20:23:50_PST_2025", 2025),
        CudaRelease("13.0.2", "13.0.88", "36424714_0", "Wed_Aug_20_01:58:59_PM_PDT_2025", 2025),
    )
}
# Which doubles each CUDA repository (cuda/repos/<os>/x86_64/) serves.
CUDA_REPOS: dict[str, tuple[str, ...]] = {
    "debian12": ("cuda-toolkit-12-6", "cuda-toolkit-12-8"),
    "debian13": ("cuda-toolkit-12-8", "cuda-toolkit-13-0"),
}


def nvcc_script(release: CudaRelease) -> str:
    return f"""#!/bin/sh
# gpu-lab double of nvcc from CUDA {release.version}: prints the version banner, compiles nothing.
case "${{1:-}}" in
  --version|-V)
    cat <<'EOF'
nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-{release.copyright_year} NVIDIA Corporation
Built on {release.built_on}
Cuda compilation tools, release {release.series}, V{release.nvcc_version}
Build cuda_{release.series}.r{release.series}/compiler.{release.compiler_build}
EOF
    exit 0 ;;
esac
echo "nvcc: only --version is available in the gpu-lab double" >&2
exit 1
"""


def cuda_version_json(release: CudaRelease) -> str:
    document = {
        "cuda": {"name": "CUDA SDK", "version": release.version},
        "cuda_nvcc": {"name": "CUDA NVCC", "version": release.nvcc_version},
    }
    return json.dumps(document, indent=3) + "\n"


def cuda_alternatives(release: CudaRelease) -> tuple[tuple[str, str], ...]:
    """(alternative name, link) pairs NVIDIA's config packages register for a toolkit."""
    return (("cuda", "/usr/local/cuda"), (f"cuda-{release.major}", f"/usr/local/cuda-{release.major}"))


def cuda_postinst(release: CudaRelease) -> str:
    installs = "\n".join(
        f"    update-alternatives --install {link} {name} {release.prefix} {release.priority}"
        for name, link in cuda_alternatives(release))
    return f"""#!/bin/sh
set -e
# gpu-lab double: registers /usr/local/cuda and /usr/local/cuda-{release.major} like NVIDIA's packages.
if [ "$1" = configure ]; then
{installs}
fi
exit 0
"""


def cuda_prerm(release: CudaRelease) -> str:
    removes = "\n".join(f"    update-alternatives --remove {name} {release.prefix}"
                        for name, _ in cuda_alternatives(release))
    return f"""#!/bin/sh
set -e
if [ "$1" = remove ] || [ "$1" = deconfigure ]; then
{removes}
fi
exit 0
"""


def cuda_package(release: CudaRelease) -> DebPackage:
    readme = (f"gpu-lab lab double of the CUDA {release.version} toolkit: no libraries are installed here.\n"
              f"bin/nvcc only prints the version banner of CUDA {release.version}.\n").encode()
    return DebPackage(
        name=release.package,
        version=f"{release.version}-{DEB_REVISION}",
        section="utils",
        summary=f"{DOUBLE_PREFIX} CUDA {release.version} toolkit layout with a version-only nvcc",
        description=(f"Stands in for NVIDIA's {release.package} in the gpu-lab mirror, where\n"
                     f"NVIDIA's CUDA repository cannot be reached. Installs {release.prefix}/ with\n"
                     "bin/nvcc (prints the version banner only), lib64/ (a README, no libraries)\n"
                     f"and version.json, and registers the cuda and cuda-{release.major} alternatives."),
        files=(
            PackageFile(f"{release.prefix}/bin/nvcc", nvcc_script(release).encode(), 0o755),
            PackageFile(f"{release.prefix}/lib64/README.gpu-lab-double", readme),
            PackageFile(f"{release.prefix}/version.json", cuda_version_json(release).encode()),
        ),
        scripts=(("postinst", cuda_postinst(release)), ("prerm", cuda_prerm(release))),
    )


def cuda_packages(os_key: str) -> list[DebPackage]:
    return [cuda_package(CUDA_RELEASES[name]) for name in CUDA_REPOS[os_key]]


# --------------------------------------------------------------------------------------
# NVIDIA driver: lab doubles in the CUDA repository's two naming schemes
# --------------------------------------------------------------------------------------
#
# Up to branch 580 the driver metapackages carry the branch (cuda-drivers-580, nvidia-open-580); from 590 they do not
# (cuda-drivers, nvidia-open), and nvidia-driver-pinning-<branch> keeps apt on a branch. The doubles install no driver:
# each installs /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.<version>, a text file, which is what the lab's nvidia-smi
# double and the nvidia_driver_info module read the installed driver version from. Versions are NVIDIA's published
# ones (lab/doubles/SOURCES.md says where each was seen).

NVML_LIBDIR = "/usr/lib/x86_64-linux-gnu"
PINNING_PREFERENCES_DIR = "/etc/apt/preferences.d"
# The virtual package every pinning double provides and conflicts with: one branch pinned at a time.
PINNING_VIRTUAL = "nvidia-driver-pinning"
FIRST_UNVERSIONED_BRANCH = 590
# The daemon double does not follow the driver's branch (it has nothing to do without a GPU).
PERSISTENCED_VERSION = "580.105.08"


@dataclasses.dataclass(frozen=True)
class DriverRelease:
    version: str  # 590.48.01

    @property
    def branch(self) -> str:
        return self.version.split(".")[0]

    @property
    def unversioned(self) -> bool:
        """Whether NVIDIA's package names for this branch carry no branch (590 and later)."""
        return int(self.branch) >= FIRST_UNVERSIONED_BRANCH

    def metapackage(self, flavour: str) -> str:
        """cuda-drivers (proprietary) or nvidia-open (open), with the branch before 590."""
        base = {"proprietary": "cuda-drivers", "open": "nvidia-open"}[flavour]
        return base if self.unversioned else f"{base}-{self.branch}"

    @property
    def pinning_package(self) -> str:
        return f"nvidia-driver-pinning-{self.branch}"


# 580 in the old scheme; 590 and 595 in the new one (a branch change that keeps the package names), and 610 beside
# them so that each pinning package has a newer branch to keep apt away from.
DRIVER_RELEASES: tuple[DriverRelease, ...] = (
    DriverRelease("580.105.08"), DriverRelease("590.48.01"), DriverRelease("595.71.05"), DriverRelease("610.43.02"))
# Branches that get a pinning package double (NVIDIA publishes one per branch; the lab moves between these).
PINNED_BRANCHES: tuple[str, ...] = ("590", "595")


def nvml_library_file(release: DriverRelease) -> PackageFile:
    text = (f"gpu-lab double: stands for NVIDIA's libnvidia-ml.so.{release.version}; not a library.\n"
            "The lab's nvidia-smi double and the nvidia_driver_info module read the driver version from this name.\n")
    return PackageFile(f"{NVML_LIBDIR}/libnvidia-ml.so.{release.version}", text.encode())


def driver_metapackage(release: DriverRelease, flavour: str) -> DebPackage:
    """One flavour's driver metapackage double; the other flavour of the same release conflicts with it (same file)."""
    other = release.metapackage("open" if flavour == "proprietary" else "proprietary")
    kind = "open GPU kernel modules" if flavour == "open" else "proprietary kernel modules"
    return DebPackage(
        name=release.metapackage(flavour),
        version=f"{release.version}-{DEB_REVISION}",
        section="metapackages",
        summary=f"{DOUBLE_PREFIX} NVIDIA driver {release.version} ({kind}), no driver inside",
        description=(f"Stands in for NVIDIA's {release.metapackage(flavour)} {release.version} in the gpu-lab\n"
                     "mirror's copy of the CUDA repository layout. It installs no kernel module and\n"
                     f"no library: only {NVML_LIBDIR}/libnvidia-ml.so.{release.version},\n"
                     "a text file whose name tells the lab's nvidia-smi double which driver is\n"
                     "installed."),
        files=(nvml_library_file(release),),
        conflicts=(other,),
        replaces=(other,),
    )


def pinning_preferences(branch: str, packages: Sequence[str]) -> str:
    """The apt preferences the pinning double installs: the driver packages at the branch, above any other version."""
    return (f"# gpu-lab double of NVIDIA's {PINNING_VIRTUAL}-{branch}: keeps apt on driver branch {branch}.\n"
            f"Package: {' '.join(packages)}\n"
            f"Pin: version {branch}.*\n"
            "Pin-Priority: 1000\n")


def pinning_package(branch: str) -> DebPackage:
    names = sorted({release.metapackage(flavour) for release in DRIVER_RELEASES if release.unversioned
                    for flavour in ("proprietary", "open")})
    name = f"{PINNING_VIRTUAL}-{branch}"
    return DebPackage(
        name=name,
        version=f"{branch}-{DEB_REVISION}",
        section="metapackages",
        summary=f"{DOUBLE_PREFIX} keeps apt on NVIDIA driver branch {branch}",
        description=(f"Stands in for NVIDIA's {name}. It installs an apt preferences file,\n"
                     f"{PINNING_PREFERENCES_DIR}/{name}, that gives the {branch}.* versions of\n"
                     f"{', '.join(names)} priority 1000, so apt installs and upgrades them\n"
                     f"within branch {branch} while newer branches sit in the same repository.\n"
                     "Only one pinning package can be installed at a time."),
        files=(PackageFile(f"{PINNING_PREFERENCES_DIR}/{name}", pinning_preferences(branch, names).encode()),),
        provides=(PINNING_VIRTUAL,),
        conflicts=(PINNING_VIRTUAL,),
        replaces=(PINNING_VIRTUAL,),
    )


PERSISTENCED_UNIT = "nvidia-persistenced.service"


def persistenced_script() -> str:
    return """#!/bin/sh
# gpu-lab double of nvidia-persistenced: there is no GPU to keep initialised in the lab.
echo "nvidia-persistenced: gpu-lab double; no GPU to keep persistent" >&2
exit 0
"""


def persistenced_unit() -> str:
    return f"""[Unit]
Description=gpu-lab double of the NVIDIA Persistence Daemon (does nothing)

[Service]
Type=oneshot
ExecStart=/usr/bin/nvidia-persistenced
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
"""


def persistenced_package() -> DebPackage:
    # Enabled on installation, not started, as Debian packages do with their units in a container without a GPU.
    postinst = f"""#!/bin/sh
set -e
if [ "$1" = configure ]; then
    deb-systemd-helper enable {PERSISTENCED_UNIT} >/dev/null
fi
exit 0
"""
    postrm = f"""#!/bin/sh
set -e
if [ "$1" = purge ] && command -v deb-systemd-helper >/dev/null; then
    deb-systemd-helper purge {PERSISTENCED_UNIT} >/dev/null
fi
exit 0
"""
    return DebPackage(
        name="nvidia-persistenced",
        version=f"{PERSISTENCED_VERSION}-{DEB_REVISION}",
        section="utils",
        summary=f"{DOUBLE_PREFIX} nvidia-persistenced unit that does nothing",
        description=("Stands in for NVIDIA's nvidia-persistenced in the gpu-lab mirror's copy of\n"
                     f"the CUDA repository layout: a {PERSISTENCED_UNIT} (enabled on\n"
                     "installation) whose daemon only says it is a double."),
        files=(PackageFile("/usr/bin/nvidia-persistenced", persistenced_script().encode(), 0o755),
               PackageFile(f"/usr/lib/systemd/system/{PERSISTENCED_UNIT}", persistenced_unit().encode())),
        scripts=(("postinst", postinst), ("postrm", postrm)),
    )


def driver_packages() -> list[DebPackage]:
    """Every driver double of a CUDA repository: both flavours of each release, the pinning packages, the daemon."""
    packages = [driver_metapackage(release, flavour) for release in DRIVER_RELEASES for flavour in ("proprietary", "open")]
    packages += [pinning_package(branch) for branch in PINNED_BRANCHES]
    packages.append(persistenced_package())
    return packages
