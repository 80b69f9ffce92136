"""Unit tests for the NVIDIA-style flat repositories of `labctl mirror` (lab/nvidia_packages.py and the flat-repo
helpers in lab/mirror.py) and the Go components they build on. No root, podman or network needed; the .deb builds
need dpkg-deb, which every Debian host has."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LAB_DIR = Path(__file__).resolve().parents[2] / "lab"
sys.path.insert(0, str(LAB_DIR))

import gobuild  # noqa: E402
import mirror  # noqa: E402
import nvidia_packages as pkgs  # noqa: E402
from _common import LabError  # noqa: E402

TOOLKIT_VERSION = "1.20.2-1"
FAKE_BINARIES = {name: f"\x7fELF {name}\0GLIBC_2.2.5\0GLIBC_2.34\0".encode()
                 for name in (*pkgs.TOOLKIT_BASE_BINARIES, pkgs.TOOLKIT_HOOK_BINARY)}
CONFIG = b'[nvidia-container-runtime]\nlog-level = "info"\n'
needs_dpkg_deb = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")


def control_fields(package: pkgs.DebPackage) -> dict[str, str]:
    return mirror.parse_deb822(pkgs.render_control(package))[0]


def toolkit() -> dict[str, pkgs.DebPackage]:
    return {p.name: p for p in pkgs.toolkit_packages("v1.20.2", FAKE_BINARIES, CONFIG)}


# --- the pinned version -----------------------------------------------------------------------------------------


def test_toolkit_version_comes_from_go_mod() -> None:
    component = gobuild.COMPONENTS["nvidia-container-toolkit"]
    go_mod = (component.source_dir / "go.mod").read_text()
    assert pkgs.deb_version(gobuild.pinned_version(go_mod, component.module)) == TOOLKIT_VERSION


def test_deb_version_rejects_pseudo_versions() -> None:
    with pytest.raises(LabError, match="unexpected toolkit version"):
        pkgs.deb_version("v1.20.2-0.20250101000000-abcdef123456")


def test_toolkit_and_containerd_builds_set_version_and_static_flags() -> None:
    nct = gobuild.COMPONENTS["nvidia-container-toolkit"]
    assert "internal/info.version=1.20.2" in gobuild.ldflags(nct, "v1.20.2")
    assert "--unresolved-symbols=ignore-in-object-files" in gobuild.ldflags(nct, "v1.20.2")
    containerd = gobuild.COMPONENTS["containerd"]
    command = gobuild.build_command("go", containerd, "v2.2.9", Path("/out"))
    assert command[command.index("-tags") + 1] == "urfave_cli_no_docs,no_btrfs"
    assert "containerd/v2/version.Version=v2.2.9" in " ".join(command)
    assert gobuild.go_output_name(containerd.packages[0]) == "containerd"


def test_build_settings_of_control_plane_components_are_just_their_ldflags() -> None:
    # Their cached builds ($GPU_LAB_CACHE/bin/<name>-<version>-<digest>) must keep their digests (Kueue came later,
    # static from the start).
    assert gobuild.build_settings(gobuild.COMPONENTS["kueue"], "v0.17.0").endswith(" cgo=0")
    for name in ("kubernetes", "etcd"):
        component = gobuild.COMPONENTS[name]
        assert gobuild.build_settings(component, "v1.2.3") == gobuild.ldflags(component, "v1.2.3")
    assert gobuild.build_settings(gobuild.COMPONENTS["containerd"], "v2.2.9").endswith(
        " tags=urfave_cli_no_docs,no_btrfs cgo=0")


def test_build_and_up_build_only_the_control_plane() -> None:
    assert set(gobuild.CONTROL_PLANE) == {"kubernetes", "etcd", "kueue"}
    assert set(gobuild.COMPONENTS) - set(gobuild.CONTROL_PLANE) == {
        "nvidia-container-toolkit", "containerd", "containerd-2.3", "containerd-2.4", "promtool", "cdi-validate",
        "device-plugin-config", "nvml-mig-mocks", "kueue-validate"}


def test_prometheus_module_versions_name_their_release() -> None:
    # Prometheus 3.XX.Y is published as Go module version v0.3XX.Y; promtool must call itself by the release.
    assert gobuild.release_version("v0.316.0") == "3.16.0"
    assert gobuild.release_version("v0.305.12") == "3.5.12"
    assert gobuild.release_version("v1.20.2") == "1.20.2"
    flags = gobuild.ldflags(gobuild.COMPONENTS["promtool"], "v0.316.0")
    assert "github.com/prometheus/common/version.Version=3.16.0" in flags


# --- control files ----------------------------------------------------------------------------------------------


def test_control_file_fields_of_the_toolkit_base() -> None:
    fields = control_fields(toolkit()["nvidia-container-toolkit-base"])
    assert fields["Package"] == "nvidia-container-toolkit-base"
    assert fields["Version"] == TOOLKIT_VERSION
    assert (fields["Architecture"], fields["Maintainer"], fields["Section"]) == ("amd64", "gpu-lab", "utils")
    assert fields["Depends"] == "libc6 (>= 2.34)"
    assert int(fields["Installed-Size"]) >= 4
    assert fields["Description"].startswith("NVIDIA container toolkit base")


def test_toolkit_depends_like_upstream() -> None:
    depends = control_fields(toolkit()["nvidia-container-toolkit"])["Depends"].split(", ")
    assert depends[:3] == ["nvidia-container-toolkit-base (= 1.20.2-1)", "libnvidia-container-tools (>= 1.20.2-1)",
                           "libnvidia-container-tools (<< 2.0.0)"]


def test_toolkit_base_ships_the_config_as_a_conffile() -> None:
    files = {f.path: f for f in toolkit()["nvidia-container-toolkit-base"].files}
    assert files["/etc/nvidia-container-runtime/config.toml"].conffile
    assert files["/etc/nvidia-container-runtime/config.toml"].data == CONFIG
    assert {path for path, f in files.items() if f.mode == 0o755} == {
        "/usr/bin/nvidia-ctk", "/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-cdi-hook"}


def test_toolkit_packages_fail_naming_a_missing_binary() -> None:
    with pytest.raises(LabError, match="nvidia-cdi-hook"):
        pkgs.toolkit_packages("v1.20.2", {k: v for k, v in FAKE_BINARIES.items() if k != "nvidia-cdi-hook"}, CONFIG)


def test_libc_dependency_takes_the_newest_symbol_version_and_none_for_static() -> None:
    assert pkgs.libc_dependency([b"GLIBC_2.2.5\0", b"GLIBC_2.34\0GLIBC_2.17\0"]) == ("libc6 (>= 2.34)",)
    assert pkgs.libc_dependency([b"static Go binary"]) == ()


def test_multiline_description_is_indented_with_dot_for_blank_lines() -> None:
    text = pkgs.render_description("summary", "first\n\nsecond")
    assert text == "Description: summary\n first\n .\n second"


def test_doubles_say_so_in_their_description_and_real_packages_do_not() -> None:
    doubles = [*pkgs.libnvidia_container_packages(TOOLKIT_VERSION),
               *(p for key in pkgs.CUDA_REPOS for p in pkgs.cuda_packages(key))]
    for package in doubles:
        assert control_fields(package)["Description"].startswith("gpu-lab double:"), package.name
    for package in toolkit().values():
        assert "double" not in control_fields(package)["Description"].split("\n")[0]


def test_libnvidia_container_doubles_satisfy_the_toolkit() -> None:
    library, tools = pkgs.libnvidia_container_packages(TOOLKIT_VERSION)
    assert (library.name, library.section, tools.name, tools.section) == (
        "libnvidia-container1", "libs", "libnvidia-container-tools", "utils")
    assert control_fields(tools)["Depends"] == "libnvidia-container1 (>= 1.20.2-1)"


def test_package_digest_is_stable_and_follows_content() -> None:
    base = toolkit()["nvidia-container-toolkit-base"]
    assert pkgs.package_digest(base) == pkgs.package_digest(toolkit()["nvidia-container-toolkit-base"])
    changed = pkgs.dataclasses.replace(base, files=(*base.files[:-1], pkgs.PackageFile(
        pkgs.TOOLKIT_CONFIG, CONFIG + b"#\n", conffile=True)))
    assert pkgs.package_digest(changed) != pkgs.package_digest(base)


# --- scripts of the doubles ---------------------------------------------------------------------------------------


def run_script(tmp_path: Path, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script"
    script.write_text(text, encoding="utf-8")
    script.chmod(0o755)
    return subprocess.run([str(script), *args], capture_output=True, text=True, check=False)


@pytest.mark.parametrize("package", sorted(pkgs.CUDA_RELEASES))
def test_nvcc_double_prints_the_real_banner_format(tmp_path: Path, package: str) -> None:
    release = pkgs.CUDA_RELEASES[package]
    result = run_script(tmp_path, pkgs.nvcc_script(release), "--version")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "nvcc: NVIDIA (R) Cuda compiler driver"
    assert re.fullmatch(r"Copyright \(c\) 2005-20\d\d NVIDIA Corporation", lines[1])
    assert re.fullmatch(r"Built on \w{3}_\w{3}_\d\d_[\d:]+_(?:[AP]M_)?P[SD]T_20\d\d", lines[2])
    match = re.fullmatch(r"Cuda compilation tools, release (\d+\.\d+), V(\d+\.\d+\.\d+)", lines[3])
    assert match is not None and match.group(1) == release.series and match.group(2).startswith(release.series)
    assert lines[4] == f"Build cuda_{release.series}.r{release.series}/compiler.{release.compiler_build}"
    assert "double" not in result.stdout and "real" not in result.stdout.lower()


def test_nvcc_double_refuses_to_compile(tmp_path: Path) -> None:
    result = run_script(tmp_path, pkgs.nvcc_script(pkgs.CUDA_RELEASES["cuda-toolkit-12-8"]), "-c", "x.cu")
    assert result.returncode == 1 and "gpu-lab double" in result.stderr
    assert "# gpu-lab double of nvcc" in pkgs.nvcc_script(pkgs.CUDA_RELEASES["cuda-toolkit-12-8"])


def test_nvidia_container_cli_double(tmp_path: Path) -> None:
    script = pkgs.nvidia_container_cli_script(TOOLKIT_VERSION)
    version = run_script(tmp_path, script, "--version")
    assert version.returncode == 0
    assert version.stdout.splitlines()[:2] == ["cli-version: 1.20.2", "lib-version: 1.20.2"]
    other = run_script(tmp_path, script, "info")
    assert other.returncode == 1 and "lab double" in other.stderr


def test_cuda_alternatives_scripts_use_nvidia_names_and_priority() -> None:
    release = pkgs.CUDA_RELEASES["cuda-toolkit-12-8"]
    postinst = pkgs.cuda_postinst(release)
    assert "update-alternatives --install /usr/local/cuda cuda /usr/local/cuda-12.8 128" in postinst
    assert "update-alternatives --install /usr/local/cuda-12 cuda-12 /usr/local/cuda-12.8 128" in postinst
    prerm = pkgs.cuda_prerm(release)
    assert "update-alternatives --remove cuda /usr/local/cuda-12.8" in prerm
    assert "update-alternatives --remove cuda-12 /usr/local/cuda-12.8" in prerm
    assert pkgs.CUDA_RELEASES["cuda-toolkit-13-0"].priority == 130


def test_cuda_repos_serve_the_briefed_doubles() -> None:
    served = {key: [(p.name, p.version) for p in pkgs.cuda_packages(key)] for key in pkgs.CUDA_REPOS}
    assert served == {
        "debian12": [("cuda-toolkit-12-6", "12.6.3-1"), ("cuda-toolkit-12-8", "12.8.1-1")],
        "debian13": [("cuda-toolkit-12-8", "12.8.1-1"), ("cuda-toolkit-13-0", "13.0.2-1")],
    }
    files = {f.path for f in pkgs.cuda_package(pkgs.CUDA_RELEASES["cuda-toolkit-13-0"]).files}
    assert files == {"/usr/local/cuda-13.0/bin/nvcc", "/usr/local/cuda-13.0/lib64/README.gpu-lab-double",
                     "/usr/local/cuda-13.0/version.json"}


# --- flat repositories ------------------------------------------------------------------------------------------


def repos() -> list[mirror.FlatRepo]:
    return mirror.nvidia_flat_repos("v1.20.2", FAKE_BINARIES, CONFIG)


def test_flat_repos_paths_follow_nvidia_layout() -> None:
    assert [repo.path for repo in repos()] == [
        "libnvidia-container/stable/deb/amd64", "cuda/repos/debian12/x86_64", "cuda/repos/debian13/x86_64"]
    assert sorted(p.filename for p in repos()[0].packages) == [
        "libnvidia-container-tools_1.20.2-1_amd64.deb", "libnvidia-container1_1.20.2-1_amd64.deb",
        "nvidia-container-toolkit-base_1.20.2-1_amd64.deb", "nvidia-container-toolkit_1.20.2-1_amd64.deb"]


def test_flat_release_fields_have_origin_and_no_suite() -> None:
    fields = mirror.flat_release_fields(repos()[0])
    assert fields["Origin"] == "gpu-lab" and fields["Architectures"] == "amd64"
    assert "Suite" not in fields and "Components" not in fields


def test_flat_source_stanza_is_a_flat_deb822_source() -> None:
    stanza = mirror.parse_deb822(mirror.flat_source_stanza("cuda/repos/debian12/x86_64"))[0]
    assert stanza == {"Types": "deb", "URIs": "http://127.0.0.1:8080/cuda/repos/debian12/x86_64/", "Suites": "/",
                      "Signed-By": "/etc/apt/keyrings/gpu-lab-mirror.asc"}


def test_flat_repos_digest_stable_and_tracks_key_and_content() -> None:
    base = mirror.flat_repos_digest(repos(), "AAAA")
    assert base == mirror.flat_repos_digest(repos(), "AAAA")
    assert base != mirror.flat_repos_digest(repos(), "BBBB")
    other = mirror.nvidia_flat_repos("v1.20.2", {**FAKE_BINARIES, "nvidia-ctk": b"other"}, CONFIG)
    assert base != mirror.flat_repos_digest(other, "AAAA")


def test_flat_verify_installs_check_the_whole_toolkit_from_gpu_lab() -> None:
    checks = mirror.flat_verify_installs(TOOLKIT_VERSION, "debian12")
    assert checks[0] == (("nvidia-container-toolkit=1.20.2-1",), (
        "nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
        "libnvidia-container1"))
    assert (("cuda-toolkit-12-8",), ("cuda-toolkit-12-8",)) in checks


# --- .deb builds ---------------------------------------------------------------------------------------------------


@needs_dpkg_deb
def test_build_deb_is_reproducible_and_keeps_metadata(tmp_path: Path) -> None:
    package = pkgs.cuda_package(pkgs.CUDA_RELEASES["cuda-toolkit-12-8"])
    first = pkgs.build_deb(package, tmp_path / "a").read_bytes()
    second = pkgs.build_deb(package, tmp_path / "b").read_bytes()
    assert first == second
    deb = tmp_path / "a" / package.filename
    info = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
    assert mirror.parse_deb822(info)[0]["Package"] == "cuda-toolkit-12-8"
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    assert "-rwxr-xr-x root/root" in listing and "./usr/local/cuda-12.8/bin/nvcc" in listing
    control = subprocess.run(["dpkg-deb", "--ctrl-tarfile", str(deb)], capture_output=True, check=True).stdout
    assert b"postinst" in control and b"prerm" in control


@needs_dpkg_deb
def test_build_deb_lists_conffiles(tmp_path: Path) -> None:
    deb = pkgs.build_deb(toolkit()["nvidia-container-toolkit-base"], tmp_path)
    conffiles = subprocess.run(["dpkg-deb", "-I", str(deb), "conffiles"], capture_output=True, text=True,
                               check=True).stdout
    assert conffiles.strip() == "/etc/nvidia-container-runtime/config.toml"


def test_version_json_parses() -> None:
    document = json.loads(pkgs.cuda_version_json(pkgs.CUDA_RELEASES["cuda-toolkit-12-6"]))
    assert document["cuda"]["version"] == "12.6.3" and document["cuda_nvcc"]["version"] == "12.6.85"


def test_containerd_module_accepts_this_go() -> None:
    go_mod = (gobuild.COMPONENTS["containerd"].source_dir / "go.mod").read_text()
    directive = re.search(r"^go (\d+)\.(\d+)", go_mod, re.MULTILINE)
    assert directive is not None and (int(directive[1]), int(directive[2])) <= (1, 26)
    assert gobuild.pinned_version(go_mod, "github.com/containerd/containerd/v2").startswith("v2.")


# --- driver doubles: both naming schemes ---------------------------------------------------------------------------


def driver_doubles() -> dict[tuple[str, str], pkgs.DebPackage]:
    return {(p.name, p.version): p for p in pkgs.driver_packages()}


def test_driver_doubles_carry_both_naming_schemes() -> None:
    assert sorted(driver_doubles()) == [
        ("cuda-drivers", "590.48.01-1"), ("cuda-drivers", "595.71.05-1"), ("cuda-drivers", "610.43.02-1"),
        ("cuda-drivers-580", "580.105.08-1"), ("nvidia-driver-pinning-590", "590-1"),
        ("nvidia-driver-pinning-595", "595-1"), ("nvidia-open", "590.48.01-1"), ("nvidia-open", "595.71.05-1"),
        ("nvidia-open", "610.43.02-1"), ("nvidia-open-580", "580.105.08-1"), ("nvidia-persistenced", "580.105.08-1")]
    for package in driver_doubles().values():
        assert control_fields(package)["Description"].startswith("gpu-lab double:"), package.name


def test_driver_doubles_are_the_names_the_role_installs() -> None:
    """The mirror serves what the nvidia_driver role's Debian catalogs name for 580 (old scheme) and 590 (new)."""
    import yaml

    catalog = yaml.safe_load((LAB_DIR.parent / "roles" / "nvidia_driver" / "vars" / "Debian-12.yml").read_text())
    series = catalog["_nvidia_driver_catalogs"]["cuda_repo"]["series"]
    names = {name for name, _version in driver_doubles()}
    for key, branch in (("*", "580"), (">=590", "590")):
        for part in ("pinning", "open", "proprietary", "persistenced"):
            for name in series[key].get(part, []):
                assert name.replace("{{ _nvidia_driver_branch }}", branch) in names, (key, part, name)


@pytest.mark.parametrize("release", pkgs.DRIVER_RELEASES, ids=lambda release: release.version)
def test_each_driver_double_installs_the_nvml_file_the_smi_double_reads(release: pkgs.DriverRelease) -> None:
    for flavour in ("open", "proprietary"):
        package = pkgs.driver_metapackage(release, flavour)
        assert [f.path for f in package.files] == [f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{release.version}"]
        # Both flavours of one release install the same file: one at a time.
        other = pkgs.driver_metapackage(release, "proprietary" if flavour == "open" else "open")
        assert control_fields(package)["Conflicts"] == other.name


def test_pinning_double_pins_the_unversioned_names_to_its_branch() -> None:
    package = driver_doubles()[("nvidia-driver-pinning-590", "590-1")]
    (preferences,) = package.files
    assert preferences.path == "/etc/apt/preferences.d/nvidia-driver-pinning-590"
    text = preferences.data.decode()
    assert text.startswith("# gpu-lab double of NVIDIA's nvidia-driver-pinning-590")
    stanza = mirror.parse_deb822("\n".join(line for line in text.splitlines() if not line.startswith("#")))[0]
    assert stanza == {"Package": "cuda-drivers nvidia-open", "Pin": "version 590.*", "Pin-Priority": "1000"}
    fields = control_fields(package)
    assert fields["Provides"] == fields["Conflicts"] == fields["Replaces"] == "nvidia-driver-pinning"


needs_apt_ftparchive = pytest.mark.skipif(shutil.which("apt-ftparchive") is None, reason="apt-utils is not installed")


@needs_dpkg_deb
@needs_apt_ftparchive
def test_apt_resolves_within_the_pinned_branch_only_with_the_pinning_preferences(tmp_path: Path) -> None:
    """Real apt against the doubles: without a pinning package's preferences nvidia-open resolves to the newest branch
    (610), with them to the pinned one, and the branch-named 580 package is there for the old scheme."""
    repo = tmp_path / "repo"
    for package in pkgs.driver_packages():
        pkgs.build_deb(package, repo)
    packages = subprocess.run(["apt-ftparchive", "packages", "."], cwd=repo, capture_output=True, text=True,
                              check=True).stdout
    (repo / "Packages").write_text(packages, encoding="utf-8")
    state = tmp_path / "apt"
    for sub in ("apt.conf.d", "preferences.d", "sources.list.d", "state", "lists/partial", "cache/archives/partial",
                "log"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    (state / "status").write_text("", encoding="utf-8")
    (state / "sources.list").write_text(f"deb [trusted=yes] file:{repo} ./\n", encoding="utf-8")
    (state / "apt.conf").write_text(mirror.private_apt_conf(state), encoding="utf-8")
    env = {"APT_CONFIG": str(state / "apt.conf"), "LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}

    def simulate(*names: str) -> dict[str, str]:
        result = subprocess.run(["apt-get", "install", "-s", *names], env=env, capture_output=True, text=True,
                                check=True)
        return {line.split()[1]: line.split()[2].strip("(") for line in result.stdout.splitlines()
                if line.startswith("Inst ")}

    subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True, check=True)
    assert simulate("nvidia-open") == {"nvidia-open": "610.43.02-1"}
    assert simulate("cuda-drivers-580") == {"cuda-drivers-580": "580.105.08-1"}
    for branch, version in (("590", "590.48.01-1"), ("595", "595.71.05-1")):
        for old in (state / "preferences.d").iterdir():
            old.unlink()
        (preferences,) = driver_doubles()[(f"nvidia-driver-pinning-{branch}", f"{branch}-1")].files
        (state / "preferences.d" / f"nvidia-driver-pinning-{branch}").write_bytes(preferences.data)
        assert simulate("nvidia-open") == {"nvidia-open": version}
        assert simulate("cuda-drivers") == {"cuda-drivers": version}


def test_flat_verify_installs_resolve_the_driver_doubles() -> None:
    checks = mirror.flat_verify_installs(TOOLKIT_VERSION, "debian13")
    for name in ("nvidia-open-580", "cuda-drivers-580", "nvidia-driver-pinning-590", "nvidia-driver-pinning-595"):
        assert ((name,), (name,)) in checks


@pytest.mark.parametrize("release", pkgs.DRIVER_RELEASES, ids=lambda release: release.version)
def test_the_nvidia_smi_double_reports_the_driver_double_installed(tmp_path: Path, release: pkgs.DriverRelease) -> None:
    """The file a driver double installs is what the lab's nvidia-smi double reads the driver version from."""
    libdir = tmp_path / "lib"
    for package in (pkgs.driver_metapackage(release, "open"), pkgs.persistenced_package()):
        for item in package.files:
            if item.path.startswith(pkgs.NVML_LIBDIR + "/"):
                target = libdir / item.path.removeprefix(pkgs.NVML_LIBDIR + "/")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(item.data)
    description = tmp_path / "gpus.json"
    description.write_text(json.dumps({"product": "NVIDIA H100 80GB HBM3", "count": 1}), encoding="utf-8")
    env = {"GPU_LAB_GPUS": str(description), "GPU_LAB_NVML_LIBDIR": str(libdir), "PATH": "/usr/bin:/bin", "LC_ALL": "C"}
    result = subprocess.run([str(LAB_DIR / "doubles" / "nvidia-smi"), "--version"], capture_output=True, text=True,
                            check=False, timeout=30, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"DRIVER version      : {release.version}" in result.stdout
