"""`labctl mirror`: a signed local apt repository of Debian's real NVIDIA driver packages, plus NVIDIA-style flat
repositories, proved in a throwaway container.

Top to bottom:
  package sets        what the mirror serves, read from the nvidia_driver role's vars (its distribution catalog)
  private apt tree    apt with sources, lists and an empty dpkg status of its own: the host's apt is untouched
  apt output, deb822  `apt-get --print-uris` and `install -s` output, Packages and Release files
  Gpg                 the mirror's signing key (generated once)
  Debian dists        the closure of each package set outside main: downloaded, laid out, indexed, signed
                      (ensure_debian_dists, near the end, ties these steps together)
  flat repositories   the container toolkit (built from NVIDIA's Go source) with libnvidia-container doubles, and
                      CUDA toolkit doubles (lab/nvidia_packages.py), in NVIDIA's flat layout
  verify              apt in a throwaway lab container trusts all of it and resolves the packages from it
  cmd_mirror          the command

Standard library only, except the package sets: PyYAML reads the role's vars (the virtualenv's, or Debian's
python3-yaml), imported only when the sets are first needed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gzip
import json
import os
import re
import shutil
import time
import urllib.parse
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import gobuild
import nvidia_packages
from _common import (
    Heartbeat,
    LabError,
    Stopwatch,
    cache_root,
    debian_mirror,
    file_digest,
    file_lock,
    format_bytes,
    format_seconds,
    log,
    require_root,
    require_tools,
    run,
    sha256_bytes,
    write_if_changed,
)
from images import ensure_image, image_recipe

ROOT = Path(__file__).resolve().parents[1]
MIRROR_LAYOUT_VERSION = 1
# The mirror serves every branch and module flavour of the nvidia_driver role's distribution catalog on each suite:
# mirror_package_sets() reads them from the role's vars file for that suite.
DRIVER_VARS_DIR = ROOT / "roles" / "nvidia_driver" / "vars"
MIRROR_SUITE_VARS = {"bookworm": "Debian-12.yml", "trixie": "Debian-13.yml"}
DRIVER_CATALOG_KEY = ("_nvidia_driver_catalogs", "distribution", "series")
PERSISTENCED_KEY = "persistenced"  # packages added to every flavour of the branch
NON_FLAVOUR_KEYS = (PERSISTENCED_KEY, "pinning")  # series keys that are not module flavours

MIRROR_VERIFY_IMAGE = {"bookworm": "debian12", "trixie": "debian13"}
MIRROR_VERIFY_INSTALL = ("nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi")
NON_MAIN_COMPONENTS = ("contrib", "non-free", "non-free-firmware")
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
KEY_FILE_NAME = "gpu-lab-mirror.asc"
KEY_UID = "gpu-lab local mirror <gpu-lab-mirror@localhost>"
STAMP_NAME = ".gpu-lab-mirror.json"
LISTS_MAX_AGE_S = 24 * 3600


def driver_package_sets(vars_file: Path) -> tuple[tuple[str, ...], ...]:
    """The package sets of one nvidia_driver vars file, in the file's order: for each branch of
    _nvidia_driver_catalogs.distribution.series and each of its module flavours (every key but `persistenced`), the
    flavour's packages followed by the branch's `persistenced` packages."""
    try:
        import yaml  # not at the top: the other commands stay standard library only
    except ImportError as exc:
        raise LabError(f"PyYAML is needed to read the driver package sets from {vars_file}: call labctl with "
                       ".venv/bin/python (the Makefile does) or install python3-yaml") from exc
    try:
        data = yaml.safe_load(vars_file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise LabError(f"cannot read the driver package sets from {vars_file}: {exc}") from exc
    key = ".".join(DRIVER_CATALOG_KEY)
    series = data
    for part in DRIVER_CATALOG_KEY:
        series = series.get(part) if isinstance(series, Mapping) else None
    if not isinstance(series, Mapping) or not series:
        raise LabError(f"{vars_file} has no mapping {key} (branch -> module flavour -> packages)")

    def packages(branch: object, flavour: object, value: object) -> list[str]:
        where = f"{vars_file}: {key}.{branch}.{flavour}"
        if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
            raise LabError(f"{where} is not a list of package names: {value!r}")
        templated = [name for name in value if "{{" in name]
        if templated:
            raise LabError(f"{where} has a Jinja value {templated[0]!r}; the mirror reads plain package names only")
        return value

    sets = []
    for branch, flavours in series.items():
        if not isinstance(flavours, Mapping):
            raise LabError(f"{vars_file}: {key}.{branch} is not a mapping of module flavours: {flavours!r}")
        extra = packages(branch, PERSISTENCED_KEY, flavours.get(PERSISTENCED_KEY, []))
        for flavour, names in flavours.items():
            if flavour not in NON_FLAVOUR_KEYS:
                sets.append((*packages(branch, flavour, names), *extra))
    if not sets:
        raise LabError(f"{vars_file}: {key} names no module flavour")
    return tuple(sets)


@functools.cache
def mirror_package_sets() -> dict[str, tuple[tuple[str, ...], ...]]:
    """suite -> the package sets the mirror serves, from the nvidia_driver role's vars (MIRROR_SUITE_VARS); read
    once. The order is the files' order (apt resolves each set in turn)."""
    return {suite: driver_package_sets(DRIVER_VARS_DIR / name) for suite, name in MIRROR_SUITE_VARS.items()}


def release_fields(suite: str) -> dict[str, str]:
    return {
        "Origin": "gpu-lab",
        "Label": "gpu-lab",
        "Suite": suite,
        "Codename": suite,
        "Components": "main",
        "Architectures": "amd64",
        "Description": f"gpu-lab local mirror of Debian {suite} NVIDIA driver packages",
    }


def private_sources_list(mirror: str, suite: str) -> str:
    return f"deb [signed-by={DEBIAN_KEYRING}] {mirror} {suite} main contrib non-free non-free-firmware\n"


def private_apt_conf(state: Path) -> str:
    """apt configuration that sees only our sources and an empty dpkg status (read through APT_CONFIG,
    which apt reads before /etc/apt/apt.conf.d, so pointing Dir::Etc::parts elsewhere isolates it)."""
    settings = {
        "Dir::Etc::main": str(state / "apt.conf.main"),
        "Dir::Etc::parts": str(state / "apt.conf.d"),
        "Dir::Etc::sourcelist": str(state / "sources.list"),
        "Dir::Etc::sourceparts": str(state / "sources.list.d"),
        "Dir::Etc::preferences": str(state / "preferences"),
        "Dir::Etc::preferencesparts": str(state / "preferences.d"),
        "Dir::State": str(state / "state"),
        "Dir::State::Lists": str(state / "lists"),
        "Dir::State::status": str(state / "status"),
        "Dir::State::extended_states": str(state / "state" / "extended_states"),
        "Dir::Cache": str(state / "cache"),
        "Dir::Log": str(state / "log"),
        "APT::Architecture": "amd64",
        "APT::Install-Recommends": "false",
        "APT::Sandbox::User": "root",
        "Acquire::Languages": "none",
    }
    lines = [f"{key} {json.dumps(value)};" for key, value in settings.items()]
    lines.append('APT::Architectures { "amd64"; };')
    return "\n".join(lines) + "\n"


def prepare_apt_state(state: Path, mirror: str, suite: str) -> tuple[dict[str, str], bool]:
    """Create the private apt tree; returns (environment for apt, sources changed)."""
    for sub in ("apt.conf.d", "sources.list.d", "preferences.d", "state", "lists/partial", "cache/archives/partial",
                "log"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    if not (state / "status").exists():
        (state / "status").write_text("", encoding="utf-8")
    write_if_changed(state / "apt.conf", private_apt_conf(state))
    sources_changed = write_if_changed(state / "sources.list", private_sources_list(mirror, suite))
    return {"APT_CONFIG": str(state / "apt.conf"), "LC_ALL": "C"}, sources_changed


_PRINT_URI = re.compile(r"^'(?P<url>[^']+)' (?P<filename>\S+) (?P<size>\d+)(?: (?P<hash>\S+))?$")


@dataclasses.dataclass(frozen=True)
class DebUri:
    url: str
    filename: str
    size: int
    hash_algorithm: str  # hashlib name: sha256, sha512, md5 ...
    hash_value: str

    @property
    def component(self) -> str | None:
        return pool_component(self.url)


def parse_print_uris(text: str) -> list[DebUri]:
    """Parse `apt-get --print-uris` lines: 'URL' FILENAME SIZE ALGO:HEX."""
    algorithms = {"SHA256": "sha256", "SHA512": "sha512", "SHA1": "sha1", "MD5SUM": "md5", "MD5": "md5"}
    uris = []
    for line in text.splitlines():
        match = _PRINT_URI.match(line.strip())
        if not match or not match["filename"].endswith(".deb"):
            continue
        algorithm, _, value = (match["hash"] or "").partition(":")
        if algorithm.upper() not in algorithms or not value:
            raise LabError(f"apt printed a URI without a usable checksum: {line.strip()}")
        uris.append(
            DebUri(match["url"], match["filename"], int(match["size"]), algorithms[algorithm.upper()], value.lower())
        )
    return uris


def pool_component(url: str) -> str | None:
    """Archive component a .deb comes from, read from its pool/<component>/ path."""
    match = re.search(r"/pool/([^/]+)/", urllib.parse.urlparse(url).path)
    return match.group(1) if match else None


def non_main(uris: Iterable[DebUri]) -> list[DebUri]:
    """Only what Debian's main component lacks, de-duplicated, sorted by file name."""
    unique = {uri.filename: uri for uri in uris if uri.component in NON_MAIN_COMPONENTS}
    return [unique[name] for name in sorted(unique)]


def deb_filename_parts(filename: str) -> tuple[str, str, str]:
    """pkg_1%3a2.0-1_amd64.deb -> ('pkg', '1:2.0-1', 'amd64')."""
    stem = filename.removesuffix(".deb")
    parts = stem.split("_")
    if len(parts) != 3 or not filename.endswith(".deb"):
        raise LabError(f"not a Debian package file name: {filename}")
    name, version, arch = parts
    return name, urllib.parse.unquote(version), arch


def parse_deb822(text: str) -> list[dict[str, str]]:
    """Stanzas of a Packages / Release file; continuation lines keep their newline."""
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if not line.strip():
            if current:
                stanzas.append(current)
            current, key = {}, None
        elif line[0] in " \t":
            if key is None:
                raise LabError(f"continuation line before any field: {line!r}")
            current[key] += "\n" + line.strip()
        else:
            key, sep, value = line.partition(":")
            if not sep:
                raise LabError(f"malformed deb822 line: {line!r}")
            key = key.strip()
            current[key] = value.strip()
    if current:
        stanzas.append(current)
    return stanzas


def release_checksums(release: Mapping[str, str], field: str = "SHA256") -> dict[str, tuple[int, str]]:
    entries = {}
    for line in release.get(field, "").splitlines():
        parts = line.split()
        if len(parts) == 3:
            entries[parts[2]] = (int(parts[1]), parts[0])
    return entries


def release_problems(release_text: str, expected_fields: Mapping[str, str], files: Mapping[str, bytes]) -> list[str]:
    """What is wrong with a Release file, given the index files that must be listed in it."""
    stanzas = parse_deb822(release_text)
    if len(stanzas) != 1:
        return [f"Release has {len(stanzas)} stanzas, wanted 1"]
    release = stanzas[0]
    problems = [
        f"Release {key}: {release.get(key)!r}, wanted {value!r}"
        for key, value in expected_fields.items() if release.get(key) != value
    ]
    checksums = release_checksums(release)
    for path, data in files.items():
        if path not in checksums:
            problems.append(f"Release lists no SHA256 for {path}")
        elif checksums[path] != (len(data), sha256_bytes(data)):
            problems.append(f"Release SHA256 entry for {path} does not match the file")
    return problems


def packages_summary(packages_text: str) -> tuple[int, int]:
    """(package count, total .deb bytes) of a Packages index."""
    stanzas = parse_deb822(packages_text)
    return len(stanzas), sum(int(stanza.get("Size", "0")) for stanza in stanzas)


def mirror_inputs_digest(suite: str, fingerprint: str, debs: Sequence[DebUri]) -> str:
    document = {
        "layout": MIRROR_LAYOUT_VERSION,
        "suite": suite,
        "release": release_fields(suite),
        "key": fingerprint,
        "debs": sorted([deb.filename, deb.hash_algorithm, deb.hash_value] for deb in debs),
    }
    return sha256_bytes(json.dumps(document, sort_keys=True).encode("utf-8"))


def apt_update_problems(output: str) -> list[str]:
    """Lines of `apt-get update` output that mean the repository is not cleanly trusted."""
    markers = ("NO_PUBKEY", "GPG error", "not signed", "insecure", "EXPKEYSIG", "BADSIG", "weak", "Signature")
    return [
        line.strip() for line in output.splitlines()
        if line.startswith(("W:", "E:", "Err:")) or any(marker in line for marker in markers)
    ]


_INST_LINE = re.compile(
    r"^Inst (?P<name>\S+) (?:\[[^\]]*\] )?\((?P<version>\S+) (?P<origin>[^\[]*?)\s*\[(?P<arch>[^\]]+)\]\)"
)


def parse_simulated_installs(output: str) -> dict[str, str]:
    """package -> origin text of `apt-get install -s` Inst lines (e.g. 'gpu-lab:bookworm')."""
    installs = {}
    for line in output.splitlines():
        match = _INST_LINE.match(line)
        if match:
            installs[match["name"]] = match["origin"]
    return installs


def simulated_install_problems(installs: Mapping[str, str], requested: Sequence[str]) -> list[str]:
    """Why a simulated install of requested packages does not prove the mirror serves them."""
    problems = [f"{package} is not installed" for package in requested if package not in installs]
    problems += [
        f"{package} comes from {installs[package]!r}, not gpu-lab"
        for package in requested if package in installs and "gpu-lab" not in installs[package]
    ]
    return problems


def secret_key_fingerprints(colons: str) -> list[str]:
    """Fingerprints of primary secret keys in `gpg --with-colons --list-secret-keys` output."""
    fingerprints = []
    expect_fpr = False
    for line in colons.splitlines():
        fields = line.split(":")
        if fields[0] == "sec":
            expect_fpr = True
        elif fields[0] == "fpr" and expect_fpr:
            fingerprints.append(fields[9])
            expect_fpr = False
        elif fields[0] in ("ssb", "sub"):
            expect_fpr = False
    return fingerprints


class Gpg:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {"GNUPGHOME": str(home)}

    def __call__(self, *args: str, **kwargs: Any):  # noqa: ANN204
        batch = ["gpg", "--batch", "--no-tty", "--pinentry-mode", "loopback", "--passphrase", ""]
        return run([*batch, *args], env=self.env, **kwargs)

    def ensure_key(self) -> str:
        self.home.mkdir(parents=True, exist_ok=True)
        os.chmod(self.home, 0o700)
        found = secret_key_fingerprints(self("--with-colons", "--list-secret-keys").stdout)
        if found:
            return found[0]
        log(f"generating the mirror's RSA 4096 signing key in {self.home} (once)")
        self("--quick-generate-key", KEY_UID, "rsa4096", "sign", "never")
        found = secret_key_fingerprints(self("--with-colons", "--list-secret-keys").stdout)
        if not found:
            raise LabError(f"gpg generated no secret key in {self.home}")
        return found[0]

    def stop_agent(self) -> None:
        run(["gpgconf", "--kill", "gpg-agent"], env=self.env, check=False)


def apt_get(env: Mapping[str, str], *args: str, cwd: Path | None = None):  # noqa: ANN201
    return run(["apt-get", *args], env=env, cwd=cwd)


def refresh_lists(state: Path, env: Mapping[str, str], force: bool) -> None:
    stamp = state / "lists" / ".gpu-lab-updated"
    # The stamp says when, the lists say whether: a stamp beside emptied lists is not fresh.
    fresh = (stamp.exists() and time.time() - stamp.stat().st_mtime < LISTS_MAX_AGE_S
             and any((state / "lists").glob("*_Packages*")))
    if fresh and not force:
        hours = LISTS_MAX_AGE_S // 3600
        log(f"apt lists in {state / 'lists'} are less than {hours} h old; not updating (use --refresh)")
        return
    log("apt-get update (private configuration: main contrib non-free non-free-firmware) ...")
    result = apt_get(env, "update")
    problems = apt_update_problems(result.stdout + result.stderr)
    if problems:
        raise LabError("apt-get update of the private Debian lists reported:\n" + "\n".join(problems))
    stamp.touch()


def resolve_closure(env: Mapping[str, str], suite: str) -> list[DebUri]:
    uris: list[DebUri] = []
    for package_set in mirror_package_sets()[suite]:
        result = apt_get(env, "-qq", "--print-uris", "install", "--no-install-recommends", *package_set)
        found = parse_print_uris(result.stdout)
        if not found:
            raise LabError(f"apt-get --print-uris install {' '.join(package_set)} printed no packages")
        kept = non_main(found)
        log(f"closure of {' '.join(package_set)}: {len(found)} packages, {len(kept)} outside main")
        uris += kept
    return non_main(uris)


def download_debs(debs: Sequence[DebUri], downloads: Path, env: Mapping[str, str]) -> None:
    downloads.mkdir(parents=True, exist_ok=True)

    def valid(deb: DebUri) -> bool:
        path = downloads / deb.filename
        if not path.is_file() or path.stat().st_size != deb.size:
            return False
        return file_digest(path, deb.hash_algorithm) == deb.hash_value

    todo = [deb for deb in debs if not valid(deb)]
    if not todo:
        log(f"all {len(debs)} .debs already in {downloads}")
        return
    total = sum(deb.size for deb in todo)
    log(f"downloading {len(todo)} .debs ({format_bytes(total)}) into {downloads}; {len(debs) - len(todo)} cached")
    specs = []
    for deb in todo:
        name, version, arch = deb_filename_parts(deb.filename)
        specs.append(f"{name}:{arch}={version}" if arch != "all" else f"{name}={version}")
    def progress() -> str:
        return f"still downloading ({format_bytes(sum(p.stat().st_size for p in downloads.glob('*.deb')))} in cache)"

    with Heartbeat(progress):
        apt_get(env, "-q", "download", *specs, cwd=downloads)
    bad = [deb.filename for deb in todo if not valid(deb)]
    if bad:
        for name in bad:
            (downloads / name).unlink(missing_ok=True)
        raise LabError("downloaded .debs missing or failing their checksum: " + ", ".join(bad))


def lay_out_pool(debs: Sequence[DebUri], downloads: Path, pool: Path) -> None:
    pool.mkdir(parents=True, exist_ok=True)
    wanted = {deb.filename for deb in debs}
    for existing in pool.glob("*.deb"):
        if existing.name not in wanted:
            existing.unlink()
    for deb in debs:
        target = pool / deb.filename
        source = downloads / deb.filename
        if target.exists() and target.stat().st_ino == source.stat().st_ino:
            continue
        target.unlink(missing_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)


def write_indexes(dest: Path, suite: str, gpg: Gpg, fingerprint: str) -> None:
    dist = dest / "dists" / suite
    binary = dist / "main" / "binary-amd64"
    binary.mkdir(parents=True, exist_ok=True)
    packages = run(["apt-ftparchive", "packages", "pool/main"], cwd=dest).stdout
    write_if_changed(binary / "Packages", packages)
    write_if_changed(binary / "Packages.gz", gzip.compress(packages.encode("utf-8"), mtime=0))
    for old in ("Release", "InRelease", "Release.gpg"):
        (dist / old).unlink(missing_ok=True)
    options = [f"-oAPT::FTPArchive::Release::{key}={value}" for key, value in release_fields(suite).items()]
    release = run(["apt-ftparchive", *options, "release", f"dists/{suite}"], cwd=dest).stdout
    index_files = {
        "main/binary-amd64/Packages": (binary / "Packages").read_bytes(),
        "main/binary-amd64/Packages.gz": (binary / "Packages.gz").read_bytes(),
    }
    problems = release_problems(release, release_fields(suite), index_files)
    if problems:
        raise LabError("generated Release is wrong: " + "; ".join(problems))
    (dist / "Release").write_text(release, encoding="utf-8")
    sign_release(gpg, fingerprint, dist)


def sign_release(gpg: Gpg, fingerprint: str, directory: Path) -> None:
    """directory/Release -> InRelease (clearsigned) and Release.gpg (detached), checked once written."""
    release = directory / "Release"
    sign = ["--local-user", fingerprint, "--digest-algo", "SHA512", "--yes"]
    gpg(*sign, "--clearsign", "--output", str(directory / "InRelease"), str(release))
    gpg(*sign, "--armor", "--detach-sign", "--output", str(directory / "Release.gpg"), str(release))
    gpg("--verify", str(directory / "Release.gpg"), str(release))


# --- NVIDIA-style flat repositories (same key, same dest) ---------------------------------
#
# What NVIDIA's own repositories would serve, in their flat layout (`deb [signed-by=...] URL /`): the container
# toolkit under libnvidia-container/stable/deb/amd64/ and the CUDA toolkit under cuda/repos/<os>/x86_64/. See
# lab/nvidia_packages.py for which packages are real builds and which are lab doubles.

FLAT_LAYOUT_VERSION = 2  # 2: the CUDA repositories carry driver doubles
FLAT_STAMP_NAME = ".gpu-lab-nvidia-repos.json"
TOOLKIT_COMPONENT = "nvidia-container-toolkit"
TOOLKIT_REPO_PATH = "libnvidia-container/stable/deb/amd64"
FLAT_INDEX_FILES = ("Packages", "Packages.gz")
FLAT_SIGNED_FILES = ("Release", "InRelease", "Release.gpg")


def cuda_repo_path(os_key: str) -> str:
    return f"cuda/repos/{os_key}/x86_64"


@dataclasses.dataclass(frozen=True)
class FlatRepo:
    path: str  # below the mirror root, without slashes at either end
    label: str
    description: str
    packages: tuple[nvidia_packages.DebPackage, ...]


def flat_release_fields(repo: FlatRepo) -> dict[str, str]:
    """A flat repository's Release has no Suite/Components: apt addresses it as `URL /`."""
    return {"Origin": "gpu-lab", "Label": repo.label, "Architectures": "amd64", "Description": repo.description}


def flat_source_stanza(path: str) -> str:
    """deb822 source of one flat repository served by the verification container."""
    return (f"Types: deb\nURIs: http://127.0.0.1:8080/{path}/\nSuites: /\n"
            f"Signed-By: /etc/apt/keyrings/{KEY_FILE_NAME}\n")


def nvidia_flat_repos(go_version: str, binaries: Mapping[str, bytes], config_toml: bytes) -> list[FlatRepo]:
    version = nvidia_packages.deb_version(go_version)
    toolkit = FlatRepo(
        path=TOOLKIT_REPO_PATH,
        label="gpu-lab libnvidia-container",
        description=f"gpu-lab: NVIDIA container toolkit {version} (real Go build) with libnvidia-container doubles",
        packages=(*nvidia_packages.toolkit_packages(go_version, binaries, config_toml),
                  *nvidia_packages.libnvidia_container_packages(version)),
    )
    cuda = [
        FlatRepo(path=cuda_repo_path(os_key), label=f"gpu-lab cuda {os_key}",
                 description=(f"gpu-lab: CUDA toolkit and driver doubles in the layout of NVIDIA's {os_key} CUDA "
                              "repository"),
                 packages=(*nvidia_packages.cuda_packages(os_key), *nvidia_packages.driver_packages()))
        for os_key in nvidia_packages.CUDA_REPOS
    ]
    return [toolkit, *cuda]


def flat_repos_digest(repos: Sequence[FlatRepo], fingerprint: str) -> str:
    document = {
        "layout": FLAT_LAYOUT_VERSION,
        "key": fingerprint,
        "repos": [[repo.path, flat_release_fields(repo), sorted(nvidia_packages.package_digest(pkg)
                                                                 for pkg in repo.packages)] for repo in repos],
    }
    return sha256_bytes(json.dumps(document, sort_keys=True).encode("utf-8"))


def toolkit_build_inputs() -> tuple[str, dict[str, bytes], bytes]:
    """(pinned version, binaries by name, default config.toml) of NVIDIA's toolkit, built or taken from the cache."""
    build = gobuild.ensure_builds([TOOLKIT_COMPONENT])[TOOLKIT_COMPONENT]
    binaries = {name: build.binary(name).read_bytes() for name in build.component.binaries}
    config = run([str(build.binary("nvidia-ctk")), "config", "default"]).stdout
    if "[nvidia-container-runtime]" not in config:
        raise LabError(f"`{build.binary('nvidia-ctk')} config default` printed no [nvidia-container-runtime] table")
    return build.version, binaries, config.encode("utf-8")


def sync_debs(repo: FlatRepo, repo_dir: Path, built: Mapping[str, str]) -> dict[str, str]:
    """Build the .debs whose inputs changed (file name -> package digest), drop the ones no longer served."""
    wanted = {pkg.filename: pkg for pkg in repo.packages}
    for existing in repo_dir.glob("*.deb"):
        if existing.name not in wanted:
            existing.unlink()
    digests = {}
    for filename, package in sorted(wanted.items()):
        digest = nvidia_packages.package_digest(package)
        if built.get(filename) != digest or not (repo_dir / filename).is_file():
            log(f"building {filename}", repo.path)
            nvidia_packages.build_deb(package, repo_dir)
        digests[filename] = digest
    return digests


def write_flat_indexes(repo: FlatRepo, repo_dir: Path, gpg: Gpg, fingerprint: str) -> None:
    """Packages, Packages.gz, Release (checked), InRelease and Release.gpg in the repository's directory."""
    packages = run(["apt-ftparchive", "packages", "."], cwd=repo_dir).stdout
    write_if_changed(repo_dir / "Packages", packages)
    write_if_changed(repo_dir / "Packages.gz", gzip.compress(packages.encode("utf-8"), mtime=0))
    for old in FLAT_SIGNED_FILES:
        (repo_dir / old).unlink(missing_ok=True)
    fields = flat_release_fields(repo)
    options = [f"-oAPT::FTPArchive::Release::{key}={value}" for key, value in fields.items()]
    release = run(["apt-ftparchive", *options, "release", "."], cwd=repo_dir).stdout
    problems = release_problems(release, fields, {name: (repo_dir / name).read_bytes() for name in FLAT_INDEX_FILES})
    if problems:
        raise LabError(f"generated Release of {repo.path} is wrong: " + "; ".join(problems))
    (repo_dir / "Release").write_text(release, encoding="utf-8")
    sign_release(gpg, fingerprint, repo_dir)


def flat_outputs_present(dest: Path, repos: Sequence[FlatRepo]) -> bool:
    return all((dest / repo.path / name).is_file() for repo in repos for name in (*FLAT_INDEX_FILES,
                                                                                 *FLAT_SIGNED_FILES)) and all(
        (dest / repo.path / pkg.filename).is_file() for repo in repos for pkg in repo.packages)


def ensure_flat_repos(dest: Path, repos: Sequence[FlatRepo], gpg: Gpg, fingerprint: str,
                      force: bool) -> dict[str, Any]:
    """Lay out and sign every flat repository unless the stamp says nothing changed; returns the stamp."""
    stamp_path = dest / FLAT_STAMP_NAME
    stamp = json.loads(stamp_path.read_text()) if stamp_path.is_file() else {}
    digest = flat_repos_digest(repos, fingerprint)
    if stamp.get("inputs") == digest and flat_outputs_present(dest, repos) and not force:
        log(f"NVIDIA flat repositories in {dest} are up to date (inputs {digest[:12]})")
        return stamp
    built = stamp.get("debs", {}) if not force else {}
    debs: dict[str, str] = {}
    for repo in repos:
        repo_dir = dest / repo.path
        repo_dir.mkdir(parents=True, exist_ok=True)
        for filename, deb_digest in sync_debs(repo, repo_dir, built.get(repo.path, {})).items():
            debs.setdefault(repo.path, {})[filename] = deb_digest
        write_flat_indexes(repo, repo_dir, gpg, fingerprint)
        log(f"signed flat repository {repo.path}/ ({len(repo.packages)} packages)")
    stamp = {"inputs": digest, "debs": debs, "verified": False}
    write_if_changed(stamp_path, json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    return stamp


def flat_verify_installs(toolkit_version: str, os_key: str) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(apt-get install arguments, packages that must come from gpu-lab) for the flat repositories."""
    toolkit = (("nvidia-container-toolkit=" + toolkit_version,),
               ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
                "libnvidia-container1"))
    # The driver doubles of both naming schemes: branch 580's metapackage, and 590's pinning package.
    drivers = [((name,), (name,)) for name in ("nvidia-open-580", "cuda-drivers-580",
                                                *(f"nvidia-driver-pinning-{b}" for b in nvidia_packages.PINNED_BRANCHES))]
    return [toolkit, *(((name,), (name,)) for name in nvidia_packages.CUDA_REPOS[os_key]), *drivers]


def verify_flat_repos(exec_in: Any, toolkit_version: str, os_key: str) -> None:
    """Resolve the toolkit and each CUDA double from the flat repositories, then install two for real."""
    for arguments, from_gpu_lab in flat_verify_installs(toolkit_version, os_key):
        simulate = exec_in("apt-get", "install", "-s", "--no-install-recommends", *arguments)
        installs = parse_simulated_installs(simulate.stdout)
        problems = simulated_install_problems(installs, from_gpu_lab)
        if problems:
            raise LabError(f"apt-get install -s {' '.join(arguments)} did not resolve from the flat repositories: "
                           + "; ".join(problems) + "\n" + simulate.stdout[-3000:])
        log(f"container: apt resolves {' '.join(arguments)} from gpu-lab ({len(installs)} packages)")
    cuda = nvidia_packages.CUDA_RELEASES["cuda-toolkit-12-8"]
    exec_in("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-q", "-y", "--no-install-recommends",
            cuda.package, "nvidia-container-toolkit=" + toolkit_version)
    nvcc = exec_in("/usr/local/cuda/bin/nvcc", "--version").stdout
    if f"release {cuda.series}, V{cuda.nvcc_version}" not in nvcc:
        raise LabError(f"after installing {cuda.package}, /usr/local/cuda/bin/nvcc --version printed:\n{nvcc}")
    ctk = exec_in("nvidia-ctk", "--version").stdout
    if toolkit_version.split("-")[0] not in ctk:
        raise LabError(f"installed nvidia-ctk --version does not name {toolkit_version}: {ctk.strip()}")
    log(f"container: installed {cuda.package} (/usr/local/cuda -> {cuda.prefix}) and nvidia-container-toolkit; "
        f"{ctk.splitlines()[0].strip()}")


def verify_mirror(dest: Path, suite: str, toolkit_version: str) -> None:
    """Prove apt in a throwaway lab container trusts the mirror and its flat repositories and resolves the driver,
    the container toolkit and the CUDA doubles from them."""
    require_tools({"podman": "podman", "debootstrap": "debootstrap", "tar": "tar"})
    recipe = image_recipe(MIRROR_VERIFY_IMAGE[suite], debian_mirror())
    (cache_root() / "images").mkdir(parents=True, exist_ok=True)
    ensure_image(recipe, cache_root() / "images", rebuild=False)  # a no-op when `images` already built it
    ref = recipe.ref
    name = f"gpu-lab-mirror-verify-{os.getpid()}"
    os_key = MIRROR_VERIFY_IMAGE[suite]
    flat_paths = (TOOLKIT_REPO_PATH, cuda_repo_path(os_key))
    sources = "\n".join([
        "Types: deb\nURIs: http://127.0.0.1:8080/\n"
        f"Suites: {suite}\nComponents: main\nSigned-By: /etc/apt/keyrings/{KEY_FILE_NAME}\n",
        *(flat_source_stanza(path) for path in flat_paths),
    ])
    timer = Stopwatch()
    log(f"verifying the mirror in container {name} from {ref}")
    run(["podman", "run", "-d", "--name", name, "--volume", f"{dest}:/srv/mirror:ro", ref])
    try:
        def exec_in(*cmd: str, **kwargs: Any):  # noqa: ANN202
            return run(["podman", "exec", *(["-i"] if "input_text" in kwargs else []), name, *cmd], **kwargs)

        # Boot must finish first: systemd-tmpfiles empties /tmp at boot ("D /tmp"), and apt-key's temporary
        # files vanish under an apt-get update run that early ("Unknown error executing apt-key").
        # Right after `podman run` even systemd's bus is missing ("Failed to connect to bus"): poll until it answers.
        state = ""
        deadline = time.monotonic() + 120
        while state not in ("running", "degraded") and time.monotonic() < deadline:
            state = exec_in("timeout", "60", "systemctl", "is-system-running", "--wait", check=False).stdout.strip()
            if state in ("", "offline", "initializing", "starting"):
                time.sleep(0.5)
            elif state not in ("running", "degraded"):
                break
        if state not in ("running", "degraded"):
            raise LabError(f"systemd in {name} did not finish booting (state {state or 'no answer'!r})")
        run(["podman", "exec", "-d", name, "python3", "-m", "http.server", "--bind", "127.0.0.1", "8080",
             "--directory", "/srv/mirror"])
        probe = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/dists/%s/InRelease')" % suite
        for _ in range(40):
            if exec_in("python3", "-c", probe, check=False).returncode == 0:
                break
            time.sleep(0.25)
        else:
            raise LabError("the http.server inside the verification container never answered on 127.0.0.1:8080")
        exec_in("mkdir", "-p", "/etc/apt/keyrings")
        exec_in("python3", "-c", "import urllib.request; urllib.request.urlretrieve("
                f"'http://127.0.0.1:8080/{KEY_FILE_NAME}', '/etc/apt/keyrings/{KEY_FILE_NAME}')")
        exec_in("sh", "-c", "cat > /etc/apt/sources.list.d/gpu-lab-mirror.sources", input_text=sources)
        log("container: apt-get update ...")
        update = exec_in("apt-get", "update")
        problems = apt_update_problems(update.stdout + update.stderr)
        if problems:
            raise LabError("apt-get update in the container did not trust the mirror cleanly:\n" + "\n".join(problems))
        for package_set in (MIRROR_VERIFY_INSTALL, *mirror_package_sets()[suite]):
            simulate = exec_in("apt-get", "install", "-s", "--no-install-recommends", *package_set)
            installs = parse_simulated_installs(simulate.stdout)
            problems = simulated_install_problems(installs, package_set)
            if problems:
                raise LabError(
                    f"apt-get install -s --no-install-recommends {' '.join(package_set)} did not resolve from the "
                    "mirror: " + "; ".join(problems) + "\n" + simulate.stdout[-3000:]
                )
            from_mirror = sum("gpu-lab" in origin for origin in installs.values())
            log(f"container: apt resolves {' '.join(package_set)}: {len(installs)} packages, "
                f"{from_mirror} from gpu-lab")
        # Resolution reads only the indexes; one real fetch proves the pool serves files matching them.
        exec_in("sh", "-c", f"cd /tmp && apt-get -q download {MIRROR_VERIFY_INSTALL[0]}")
        verify_flat_repos(exec_in, toolkit_version, os_key)
        log(f"container: mirror verified in {format_seconds(timer.elapsed)}")
    finally:
        run(["podman", "rm", "-f", "-t", "0", name], check=False)


def ensure_debian_dists(dest: Path, suite: str, debs: Sequence[DebUri], downloads: Path, gpg: Gpg,
                        fingerprint: str, force: bool) -> dict[str, Any]:
    """dists/<suite> and pool/main from Debian's packages unless the stamp says nothing changed; returns the stamp."""
    digest = mirror_inputs_digest(suite, fingerprint, debs)
    stamp_path = dest / STAMP_NAME
    stamp = json.loads(stamp_path.read_text()) if stamp_path.is_file() else {}
    outputs = [dest / KEY_FILE_NAME] + [dest / "dists" / suite / f for f in ("InRelease", "Release.gpg")]
    if stamp.get("inputs") == digest and all(path.is_file() for path in outputs) and not force:
        log(f"mirror {dest} is up to date (inputs {digest[:12]})")
        return stamp
    log(f"laying out {len(debs)} packages in {dest}")
    dest.mkdir(parents=True, exist_ok=True)
    lay_out_pool(debs, downloads, dest / "pool" / "main")
    write_if_changed(dest / KEY_FILE_NAME, gpg("--armor", "--export", fingerprint).stdout)
    write_indexes(dest, suite, gpg, fingerprint)
    stamp = {"inputs": digest, "verified": False}
    write_if_changed(stamp_path, json.dumps(stamp, indent=2) + "\n")
    return stamp


def mark_verified(path: Path, stamp: dict[str, Any]) -> None:
    stamp["verified"] = True
    write_if_changed(path, json.dumps(stamp, indent=2, sort_keys=True) + "\n")


def cmd_mirror(args: argparse.Namespace) -> None:
    require_root()
    # gcc: NVIDIA's container toolkit is built with cgo.
    require_tools({"apt-get": "apt", "apt-ftparchive": "apt-utils", "gpg": "gnupg", "gpgconf": "gpgconf",
                   "dpkg-deb": "dpkg", "gcc": "gcc"})
    suite = args.suite
    mirror_package_sets()  # the role's vars first: a file the mirror cannot read refuses before any download
    cache = cache_root()
    dest = Path(args.dest).resolve() if args.dest else cache / "mirror"
    downloads = cache / "mirror-downloads"
    state = cache / "mirror-apt" / suite
    timer = Stopwatch()
    with file_lock(cache / f".mirror-{suite}.lock", f"mirror {suite}"), \
            file_lock(cache / ".mirror-nvidia.lock", "mirror flat repositories"):
        env, sources_changed = prepare_apt_state(state, debian_mirror(), suite)
        refresh_lists(state, env, force=args.refresh or sources_changed)
        debs = resolve_closure(env, suite)
        download_debs(debs, downloads, env)
        toolkit_go_version, binaries, config_toml = toolkit_build_inputs()
        repos = nvidia_flat_repos(toolkit_go_version, binaries, config_toml)
        gpg = Gpg(cache / "mirror-gnupg")
        try:
            fingerprint = gpg.ensure_key()
            stamp = ensure_debian_dists(dest, suite, debs, downloads, gpg, fingerprint, args.force)
            flat_stamp = ensure_flat_repos(dest, repos, gpg, fingerprint, args.force)
        finally:
            gpg.stop_agent()
        if args.no_verify:
            log("skipping the container check (--no-verify)")
        elif stamp.get("verified") and flat_stamp.get("verified") and not args.verify:
            log("container check already passed for these inputs (use --verify to run it again)")
        else:
            verify_mirror(dest, suite, nvidia_packages.deb_version(toolkit_go_version))
            mark_verified(dest / STAMP_NAME, stamp)
            mark_verified(dest / FLAT_STAMP_NAME, flat_stamp)
    count, size = packages_summary((dest / "dists" / suite / "main" / "binary-amd64" / "Packages").read_text())
    log(f"mirror: {count} packages, {format_bytes(size)} at {dest} (key {dest / KEY_FILE_NAME}) "
        f"in {format_seconds(timer.elapsed)}")
    for repo in repos:
        log(f"  http://127.0.0.1:8080/{repo.path}/ : " + ", ".join(
            f"{pkg.name} {pkg.version}" for pkg in repo.packages))
