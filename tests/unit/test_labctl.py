"""Unit tests for the pure parts of lab/labctl.py and the command modules beside it (lab/prereqs.py, lab/images.py,
lab/mirror.py, lab/tools.py): recipe hashing, containers.conf merging, apt output parsing, Release/Packages handling,
the mirror's package sets. No root, podman or network needed."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

LAB_DIR = Path(__file__).resolve().parents[2] / "lab"
sys.path.insert(0, str(LAB_DIR))

import _common  # noqa: E402
import images  # noqa: E402
import labctl  # noqa: E402
import mirror  # noqa: E402
import prereqs  # noqa: E402
import tools  # noqa: E402

MIRROR = "http://deb.debian.org/debian"


# --- caches and mirror URL -------------------------------------------------------------


def test_cache_root_defaults_to_var_cache() -> None:
    assert _common.cache_root({}) == Path("/var/cache/gpu-lab")


def test_cache_root_follows_env() -> None:
    assert _common.cache_root({"GPU_LAB_CACHE": "/srv/lab"}) == Path("/srv/lab")


def test_debian_mirror_override_drops_trailing_slash() -> None:
    assert _common.debian_mirror({"GPU_LAB_DEBIAN_MIRROR": "http://proxy:3142/debian/"}) == "http://proxy:3142/debian"
    assert _common.debian_mirror({}) == MIRROR


def test_apt_archive_dirs_one_per_image_plus_own_lanes() -> None:
    dirs = tools.apt_archive_dirs(Path("/c"))
    assert dirs == {"debian12": Path("/c/apt-archives/debian12"), "debian13": Path("/c/apt-archives/debian13"),
                    "debian12-cuda": Path("/c/apt-archives/debian12-cuda"),
                    "debian12-ctk": Path("/c/apt-archives/debian12-ctk"),
                    "debian13-ctk": Path("/c/apt-archives/debian13-ctk")}


# --- image recipes ---------------------------------------------------------------------


def test_recipe_names_and_suites() -> None:
    recipe = images.image_recipe("debian13", MIRROR)
    assert recipe.ref == "localhost/gpu-lab-debian13:latest"
    assert recipe.suite == "trixie"
    assert ("/etc/apt/sources.list", f"deb {MIRROR} trixie main\n") in recipe.files


def test_recipe_hash_is_stable_and_hex() -> None:
    first = images.recipe_hash(images.image_recipe("debian12", MIRROR))
    assert first == images.recipe_hash(images.image_recipe("debian12", MIRROR))
    assert len(first) == 64 and int(first, 16) >= 0


def test_recipe_hash_differs_between_suites() -> None:
    assert images.recipe_hash(images.image_recipe("debian12", MIRROR)) != images.recipe_hash(
        images.image_recipe("debian13", MIRROR)
    )


def test_recipe_hash_changes_with_mirror() -> None:
    assert images.recipe_hash(images.image_recipe("debian12", MIRROR)) != images.recipe_hash(
        images.image_recipe("debian12", "http://ftp.de.debian.org/debian")
    )


def test_recipe_hash_changes_with_include_list_but_not_its_order() -> None:
    base = images.image_recipe("debian12", MIRROR)
    more = dataclasses.replace(base, includes=(*base.includes, "curl"))
    shuffled = dataclasses.replace(base, includes=tuple(reversed(base.includes)))
    assert images.recipe_hash(more) != images.recipe_hash(base)
    assert images.recipe_hash(shuffled) == images.recipe_hash(base)


def test_recipe_hash_changes_with_copied_file_text() -> None:
    base = images.image_recipe("debian12", MIRROR)
    edited_files = tuple((path, text + "// edited\n") for path, text in base.files)
    assert images.recipe_hash(dataclasses.replace(base, files=edited_files)) != images.recipe_hash(base)


def test_recipe_hash_changes_with_recipe_version(monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = images.image_recipe("debian12", MIRROR)
    before = images.recipe_hash(recipe)
    monkeypatch.setattr(images, "IMAGE_RECIPE_VERSION", images.IMAGE_RECIPE_VERSION + 1)
    assert images.recipe_hash(recipe) != before


def test_import_command_labels_image_with_hash() -> None:
    recipe = images.image_recipe("debian12", MIRROR)
    cmd = images.import_command(recipe, "abc123", Path("/c/x.tar"))
    assert cmd[-2:] == ["/c/x.tar", "localhost/gpu-lab-debian12:latest"]
    assert "LABEL gpu-lab.recipe=abc123" in cmd
    assert 'CMD ["/sbin/init"]' in cmd


def test_debootstrap_command_uses_minbase_and_includes() -> None:
    cmd = images.debootstrap_command(images.image_recipe("debian12", MIRROR), Path("/r"))
    assert cmd[:2] == ["debootstrap", "--variant=minbase"]
    # python3-apt on top of the base list: Ansible's apt module needs it (check mode fails without it).
    assert cmd[2] == "--include=python3,systemd,systemd-sysv,dbus,sudo,ca-certificates,iproute2,procps,gnupg,python3-apt"
    assert cmd[3:] == ["bookworm", "/r", MIRROR]


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("I: Retrieving Release ", True),
        ("I: Unpacking required packages...", True),
        ("I: Base system installed successfully.", True),
        ("W: Failure trying to run: chroot", True),
        ("I: Retrieving zlib1g 1:1.3.dfsg+really1.3.1-1+deb13u1", False),
        ("I: Validating tar 1.35+dfsg-3.1", False),
        ("I: Unpacking libkeyutils1:amd64...", False),
        ("I: Configuring apt...", False),
        ("dpkg: warning: something", False),
    ],
)
def test_debootstrap_milestones(line: str, shown: bool) -> None:
    assert images.debootstrap_milestone(line) is shown


def test_docker_clean_hook_detected_keep_conf_not() -> None:
    docker_clean = 'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb || true"; };\n'
    assert images.is_archive_clean_hook(docker_clean)
    assert not images.is_archive_clean_hook(images.KEEP_DEBS_CONF)


def test_customise_rootfs(tmp_path: Path) -> None:
    conf_d = tmp_path / "etc/apt/apt.conf.d"
    conf_d.mkdir(parents=True)
    (conf_d / "docker-clean").write_text('DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb"; };\n')
    (conf_d / "70debconf").write_text('DPkg::Pre-Install-Pkgs {"/usr/sbin/dpkg-preconfigure --apt";};\n')
    (tmp_path / "etc/machine-id").write_text("0123456789abcdef\n")
    archives = tmp_path / "var/cache/apt/archives"
    archives.mkdir(parents=True)
    (archives / "left_1_amd64.deb").write_bytes(b"x")
    recipe = images.image_recipe("debian12", MIRROR)
    images.customise_rootfs(recipe, tmp_path)
    assert not (conf_d / "docker-clean").exists()
    assert (conf_d / "70debconf").exists()
    assert 'Binary::apt::APT::Keep-Downloaded-Packages "true";' in (conf_d / "00gpu-lab-keep-debs").read_text()
    assert (tmp_path / "etc/apt/sources.list").read_text() == f"deb {MIRROR} bookworm main\n"
    assert (tmp_path / "etc/machine-id").read_text() == ""
    assert not list(archives.glob("*.deb"))


def test_mounts_under_ignores_sibling_prefixes() -> None:
    mountinfo = (
        "36 25 0:32 / /work/rootfs/proc rw - proc proc rw\n"
        "37 25 0:33 / /work/rootfs/sys rw - sysfs sysfs rw\n"
        "38 25 0:34 / /work/rootfs2/proc rw - proc proc rw\n"
        "39 36 0:35 / /work/rootfs/proc/sys/fs/binfmt_misc rw - binfmt_misc b rw\n"
    )
    found = _common.mounts_under(Path("/work/rootfs"), mountinfo)
    assert found == ["/work/rootfs/proc/sys/fs/binfmt_misc", "/work/rootfs/proc", "/work/rootfs/sys"]


# --- prereqs: packages and containers.conf ----------------------------------------------


def test_missing_packages() -> None:
    statuses = {"podman": "install ok installed", "runc": None, "gnupg": "deinstall ok config-files"}
    assert prereqs.missing_packages(statuses) == ["runc", "gnupg"]


def test_merge_ulimits_keeps_user_entries_and_replaces_ours() -> None:
    merged = prereqs.merge_ulimits(["core=0:0", "nofile=100:200", "nofile=5:5"])
    assert merged == ["core=0:0", "nofile=1024:20000", "nproc=4096:4096"]


def test_merge_ulimits_from_nothing() -> None:
    assert prereqs.merge_ulimits([]) == list(prereqs.REQUIRED_ULIMITS)


def test_merge_conf_layers_later_wins_tables_merge_arrays_replace() -> None:
    vendor = {"containers": {"default_capabilities": ["CHOWN"], "default_ulimits": ["core=0:0"]}, "engine": {}}
    user = {"containers": {"default_ulimits": ["nofile=1:2"]}, "engine": {"runtime": "crun"}}
    dropin = {"engine": {"runtime": "runc"}}
    merged = prereqs.merge_conf_layers([vendor, user, dropin])
    assert merged == {
        "containers": {"default_capabilities": ["CHOWN"], "default_ulimits": ["nofile=1:2"]},
        "engine": {"runtime": "runc"},
    }
    assert vendor["engine"] == {}  # inputs are not mutated


def test_missing_settings_names_each_key() -> None:
    missing = prereqs.missing_settings({"engine": {"runtime": "crun", "events_logger": "file"}})
    assert missing == [
        '[engine] runtime = "runc"',
        '[engine] cgroup_manager = "cgroupfs"',
        '[network] network_backend = "netavark"',
        '[containers] default_ulimits contains "nofile=1024:20000"',
        '[containers] default_ulimits contains "nproc=4096:4096"',
    ]


def test_rendered_conf_parses_back_and_satisfies_everything() -> None:
    user = {"containers": {"default_ulimits": ["core=0:0"]}, "engine": {"runtime": "crun"}}
    rendered = tomllib.loads(prereqs.render_containers_conf(user))
    assert rendered["containers"]["default_ulimits"] == ["core=0:0", "nofile=1024:20000", "nproc=4096:4096"]
    assert prereqs.missing_settings(prereqs.merge_conf_layers([user, rendered])) == []


@pytest.fixture
def conf_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    etc = tmp_path / "etc/containers"
    etc.mkdir(parents=True)
    monkeypatch.setattr(prereqs, "CONTAINERS_CONF", etc / "containers.conf")
    monkeypatch.setattr(prereqs, "CONTAINERS_CONF_D", etc / "containers.conf.d")
    monkeypatch.setattr(prereqs, "VENDOR_CONTAINERS_CONF", tmp_path / "usr/containers.conf")
    monkeypatch.setattr(prereqs, "VENDOR_CONTAINERS_CONF_D", tmp_path / "usr/containers.conf.d")
    monkeypatch.setattr(prereqs, "log", lambda *args, **kwargs: None)
    monkeypatch.setattr(prereqs, "check_podman_effective", lambda: None)
    probes: list[int] = []
    state = {"supported": True, "probes": probes}

    def probe() -> bool:
        probes.append(1)
        return bool(state["supported"])

    monkeypatch.setattr(prereqs, "podman_reads_dropins", probe)
    return state


def test_configure_podman_writes_main_conf_when_absent(conf_paths: dict[str, object]) -> None:
    assert prereqs.configure_podman() is True
    written = tomllib.loads(prereqs.CONTAINERS_CONF.read_text())
    assert prereqs.missing_settings(written) == []
    assert prereqs.configure_podman() is False


def test_configure_podman_uses_dropin_for_user_conf_and_is_idempotent(conf_paths: dict[str, object]) -> None:
    user_text = '[containers]\ndefault_ulimits = ["core=0:0"]\n[engine]\nruntime = "runc"\n'
    prereqs.CONTAINERS_CONF.write_text(user_text)
    assert prereqs.configure_podman() is True
    assert prereqs.CONTAINERS_CONF.read_text() == user_text
    dropin = tomllib.loads((prereqs.CONTAINERS_CONF_D / prereqs.DROPIN_NAME).read_text())
    assert dropin["containers"]["default_ulimits"] == ["core=0:0", "nofile=1024:20000", "nproc=4096:4096"]
    assert prereqs.configure_podman() is False
    assert conf_paths["probes"] == [1]  # the second run did not even need to probe


def test_configure_podman_leaves_complete_user_conf_alone(conf_paths: dict[str, object]) -> None:
    prereqs.CONTAINERS_CONF.write_text(prereqs.render_containers_conf({}))
    assert prereqs.configure_podman() is False
    assert not prereqs.CONTAINERS_CONF_D.exists()


def test_configure_podman_fails_naming_keys_without_dropin_support(conf_paths: dict[str, object]) -> None:
    conf_paths["supported"] = False
    prereqs.CONTAINERS_CONF.write_text('[engine]\nruntime = "runc"\n')
    with pytest.raises(_common.LabError) as error:
        prereqs.configure_podman()
    assert 'cgroup_manager = "cgroupfs"' in str(error.value)
    assert "nproc=4096:4096" in str(error.value)
    assert not prereqs.CONTAINERS_CONF_D.exists()


def test_configure_podman_detects_later_dropin_overriding_ours(conf_paths: dict[str, object]) -> None:
    prereqs.CONTAINERS_CONF.write_text("[engine]\n")
    prereqs.CONTAINERS_CONF_D.mkdir()
    (prereqs.CONTAINERS_CONF_D / "90-user.conf").write_text('[engine]\nevents_logger = "journald"\n')
    with pytest.raises(_common.LabError, match="events_logger"):
        prereqs.configure_podman()


def test_configure_podman_rewrites_its_own_older_conf(conf_paths: dict[str, object]) -> None:
    # What prereqs wrote before the network backend was part of the lab's settings.
    older = ('# Written by lab/labctl.py prereqs (gpu-lab). Podman settings the lab needs:\n[containers]\n'
             'default_ulimits = ["nofile=1024:20000", "nproc=4096:4096"]\n[engine]\nruntime = "runc"\n'
             'cgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
    prereqs.CONTAINERS_CONF.write_text(older)
    assert prereqs.configure_podman() is True
    written = tomllib.loads(prereqs.CONTAINERS_CONF.read_text())
    assert written["network"] == {"network_backend": "netavark"}
    assert prereqs.missing_settings(written) == []
    assert not prereqs.CONTAINERS_CONF_D.exists()  # its own file, rewritten: no drop-in beside it
    assert conf_paths["probes"] == []
    assert prereqs.configure_podman() is False


def test_configure_podman_adds_the_network_backend_beside_a_user_conf(conf_paths: dict[str, object]) -> None:
    user_text = '[network]\nnetwork_backend = "cni"\ndefault_subnet = "10.99.0.0/16"\n'
    prereqs.CONTAINERS_CONF.write_text(user_text)
    assert prereqs.configure_podman() is True
    assert prereqs.CONTAINERS_CONF.read_text() == user_text
    effective = prereqs.merge_conf_layers(layer for _, layer in prereqs.conf_layers())
    assert effective["network"] == {"network_backend": "netavark", "default_subnet": "10.99.0.0/16"}


# A CNI network as `podman network ls --format json` lists it (podman 4.3, Debian 12), with the user's settings.
CNI_NETWORK = {
    "name": "team-net", "id": "ab" * 32, "driver": "bridge", "network_interface": "cni-podman1",
    "created": "2026-12-03T13:14:47Z", "subnets": [{"subnet": "10.89.7.0/24", "gateway": "10.89.7.1"}],
    "ipv6_enabled": False, "internal": True, "dns_enabled": False, "labels": {"owner": "ml-team"},
    "options": {"mtu": "1400"}, "ipam_options": {"driver": "host-local"},
}


def test_prereqs_install_what_netavark_runs_without_depending_on_it() -> None:
    # Debian 12's netavark 1.4.0 calls iptables but declares no dependency on it; aardvark-dns answers the names.
    assert {"netavark", "aardvark-dns", "iptables"} <= set(prereqs.PREREQ_PACKAGES)


def test_network_create_command_gives_a_cni_network_back_as_it_was() -> None:
    assert prereqs.network_create_command(CNI_NETWORK) == [
        "podman", "network", "create", "--driver", "bridge", "--subnet", "10.89.7.0/24", "--gateway", "10.89.7.1",
        "--internal", "--disable-dns", "--label", "owner=ml-team", "--opt", "mtu=1400", "team-net",
    ]


def test_network_create_command_keeps_dns_and_ipv6_when_the_network_had_them() -> None:
    network = {"name": "v6", "driver": "bridge", "dns_enabled": True, "ipv6_enabled": True,
               "subnets": [{"subnet": "fd00:1::/64"}], "ipam_options": {"driver": "dhcp"}}
    assert prereqs.network_create_command(network) == [
        "podman", "network", "create", "--driver", "bridge", "--subnet", "fd00:1::/64", "--ipv6",
        "--ipam-driver", "dhcp", "v6",
    ]


def test_networks_to_carry_leaves_out_the_default_and_the_labs_own() -> None:
    networks = [{"name": "podman"}, {"name": "gpu-lab"}, CNI_NETWORK]
    assert [n["name"] for n in prereqs.networks_to_carry(networks, "gpu-lab")] == ["team-net"]


def test_running_containers_split_into_the_labs_and_the_users() -> None:
    running = [{"Names": ["gpu-h100-0"], "Labels": {"gpu-lab.role": "node"}},
               {"Names": ["gpu-lab-mirror"], "Labels": {"gpu-lab.role": "mirror"}},
               {"Names": ["postgres"], "Labels": None}, {"Names": ["web"], "Labels": {"app": "web"}}]
    assert prereqs.running_containers_by_owner(running) == (["gpu-h100-0", "gpu-lab-mirror"], ["postgres", "web"])


def test_backend_move_refused_while_a_users_container_runs() -> None:
    assert prereqs.backend_move_refusal("cni", []) is None
    message = prereqs.backend_move_refusal("cni", ["web", "postgres"])
    assert message is not None
    assert "cni network backend" in message and "podman stop postgres web" in message
    assert "kept" in message


def test_configure_podman_rejects_invalid_toml(conf_paths: dict[str, object]) -> None:
    prereqs.CONTAINERS_CONF.write_text("[engine\n")
    with pytest.raises(_common.LabError, match="not valid TOML"):
        prereqs.configure_podman()


# --- mirror: apt configuration and output -------------------------------------------------


def test_private_apt_conf_isolates_sources_and_status(tmp_path: Path) -> None:
    conf = mirror.private_apt_conf(tmp_path)
    assert f'Dir::Etc::sourcelist "{tmp_path}/sources.list";' in conf
    assert f'Dir::Etc::parts "{tmp_path}/apt.conf.d";' in conf
    assert f'Dir::State::status "{tmp_path}/status";' in conf
    assert f'Dir::Cache "{tmp_path}/cache";' in conf
    assert 'APT::Architectures { "amd64"; };' in conf


def test_private_sources_list_has_every_component() -> None:
    line = mirror.private_sources_list(MIRROR, "bookworm")
    assert line.split()[-5:] == ["bookworm", "main", "contrib", "non-free", "non-free-firmware"]
    assert "signed-by=/usr/share/keyrings/debian-archive-keyring.gpg" in line


PRINT_URIS = """\
'http://deb.debian.org/debian/pool/main/d/dkms/dkms_3.0.10-8%2bdeb12u1_all.deb' dkms_3.0.10-8+deb12u1_all.deb 51640 SHA256:aa11
'http://deb.debian.org/debian/pool/non-free/n/nvidia-graphics-drivers/nvidia-smi_535.261.03-1_amd64.deb' nvidia-smi_535.261.03-1_amd64.deb 390144 SHA256:BB22
'http://deb.debian.org/debian/pool/contrib/g/glx-alternatives/update-glx_1.2.2_amd64.deb' update-glx_1.2.2_amd64.deb 17000 SHA256:cc33
'http://deb.debian.org/debian/pool/non-free-firmware/n/nvidia-graphics-drivers/firmware-nvidia-gsp_535.261.03-1_amd64.deb' firmware-nvidia-gsp_535.261.03-1_amd64.deb 100 SHA512:dd44
'http://deb.debian.org/debian/pool/main/libx/libx11/libx11-6_2%3a1.8.4-2_amd64.deb' libx11-6_2%3a1.8.4-2_amd64.deb 10 MD5Sum:ee55
"""


def test_parse_print_uris() -> None:
    uris = mirror.parse_print_uris("Reading package lists...\n" + PRINT_URIS)
    assert len(uris) == 5
    smi = uris[1]
    assert (smi.filename, smi.size, smi.hash_algorithm, smi.hash_value) == (
        "nvidia-smi_535.261.03-1_amd64.deb", 390144, "sha256", "bb22",
    )
    assert [uri.component for uri in uris] == ["main", "non-free", "contrib", "non-free-firmware", "main"]
    assert uris[3].hash_algorithm == "sha512" and uris[4].hash_algorithm == "md5"


def test_parse_print_uris_rejects_missing_checksum() -> None:
    with pytest.raises(_common.LabError, match="checksum"):
        mirror.parse_print_uris("'http://x/pool/non-free/a/a/a_1_amd64.deb' a_1_amd64.deb 10 \n")


def test_non_main_keeps_only_non_main_components_once() -> None:
    uris = mirror.parse_print_uris(PRINT_URIS + PRINT_URIS)
    kept = mirror.non_main(uris)
    assert [uri.filename for uri in kept] == [
        "firmware-nvidia-gsp_535.261.03-1_amd64.deb",
        "nvidia-smi_535.261.03-1_amd64.deb",
        "update-glx_1.2.2_amd64.deb",
    ]


def test_pool_component_of_url_without_pool() -> None:
    assert mirror.pool_component("http://deb.debian.org/debian/dists/bookworm/Release") is None
    assert mirror.pool_component("http://m/debian/pool/non-free/n/x/x.deb") == "non-free"


def test_deb_filename_parts_decodes_epoch() -> None:
    assert mirror.deb_filename_parts("libx11-6_2%3a1.8.4-2_amd64.deb") == ("libx11-6", "2:1.8.4-2", "amd64")
    with pytest.raises(_common.LabError):
        mirror.deb_filename_parts("not-a-package.tar")


def test_apt_update_problems_flags_signature_trouble_only() -> None:
    clean = (
        "Get:1 http://127.0.0.1:8080 bookworm InRelease [2038 B]\n"
        "Get:2 http://deb.debian.org/debian bookworm InRelease [151 kB]\n"
        "Fetched 15.1 MB in 3s (4517 kB/s)\nReading package lists...\n"
    )
    assert mirror.apt_update_problems(clean) == []
    bad = clean + (
        "W: GPG error: http://127.0.0.1:8080 bookworm InRelease: The following signatures couldn't be verified "
        "because the public key is not available: NO_PUBKEY 0123456789ABCDEF\n"
        "E: The repository 'http://127.0.0.1:8080 bookworm InRelease' is not signed.\n"
    )
    assert len(mirror.apt_update_problems(bad)) == 2


SIMULATE = """\
NOTE: This is only a simulation!
Inst update-glx (1.2.2 gpu-lab:bookworm [amd64])
Inst libxcb-glx0 (1.15-1 Debian:12.15/oldstable [amd64])
Inst nvidia-smi (535.261.03-1 gpu-lab:bookworm [amd64])
Inst base-files [12.4+deb12u1] (12.4+deb12u12 Debian:12.15/oldstable [amd64])
Conf nvidia-smi (535.261.03-1 gpu-lab:bookworm [amd64])
"""


def test_parse_simulated_installs() -> None:
    installs = mirror.parse_simulated_installs(SIMULATE)
    assert installs == {
        "update-glx": "gpu-lab:bookworm",
        "libxcb-glx0": "Debian:12.15/oldstable",
        "nvidia-smi": "gpu-lab:bookworm",
        "base-files": "Debian:12.15/oldstable",
    }


def test_simulated_install_problems() -> None:
    installs = mirror.parse_simulated_installs(SIMULATE)
    assert mirror.simulated_install_problems(installs, ["nvidia-smi", "update-glx"]) == []
    problems = mirror.simulated_install_problems(installs, ["nvidia-driver", "libxcb-glx0"])
    assert problems == ["nvidia-driver is not installed", "libxcb-glx0 comes from 'Debian:12.15/oldstable', not gpu-lab"]


def test_secret_key_fingerprints_skip_subkeys() -> None:
    colons = (
        "sec:u:4096:1:AAAA:1700000000:::u:::scESC:::+:::23::0:\n"
        "fpr:::::::::0123456789ABCDEF0123456789ABCDEF01234567:\n"
        "grp:::::::::ABCDEF:\n"
        "uid:u::::1700000000::HASH::gpu-lab local mirror <gpu-lab-mirror@localhost>::::::::::0:\n"
        "ssb:u:4096:1:BBBB:1700000000::::::e:::+:::23:\n"
        "fpr:::::::::FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF:\n"
    )
    assert mirror.secret_key_fingerprints(colons) == ["0123456789ABCDEF0123456789ABCDEF01234567"]
    assert mirror.secret_key_fingerprints("") == []


# --- mirror: Packages and Release ----------------------------------------------------------


PACKAGES = """\
Package: nvidia-smi
Version: 535.261.03-1
Architecture: amd64
Filename: pool/main/nvidia-smi_535.261.03-1_amd64.deb
Size: 390144
Description: NVIDIA System Management Interface
 The NVIDIA Management Library (NVML) provides a monitoring and management API.
 .
 This package contains the nvidia-smi tool.

Package: update-glx
Version: 1.2.2
Architecture: amd64
Filename: pool/main/update-glx_1.2.2_amd64.deb
Size: 17000
"""


def test_parse_deb822_stanzas_and_continuations() -> None:
    stanzas = mirror.parse_deb822(PACKAGES)
    assert [stanza["Package"] for stanza in stanzas] == ["nvidia-smi", "update-glx"]
    assert stanzas[0]["Description"].splitlines()[1:] == [
        "The NVIDIA Management Library (NVML) provides a monitoring and management API.", ".",
        "This package contains the nvidia-smi tool.",
    ]


def test_parse_deb822_rejects_garbage() -> None:
    with pytest.raises(_common.LabError):
        mirror.parse_deb822(" leading continuation\n")
    with pytest.raises(_common.LabError):
        mirror.parse_deb822("no colon here\n")


def test_packages_summary() -> None:
    assert mirror.packages_summary(PACKAGES) == (2, 390144 + 17000)


def _release_text(fields: dict[str, str], files: dict[str, bytes]) -> str:
    lines = [f"{key}: {value}" for key, value in fields.items()]
    for name, algorithm in (("MD5Sum", "md5"), ("SHA256", "sha256")):
        lines.append(f"{name}:")
        lines += [f" {hashlib.new(algorithm, data).hexdigest()} {len(data):16d} {path}" for path, data in files.items()]
    return "\n".join(lines) + "\n"


def _index_files() -> dict[str, bytes]:
    data = PACKAGES.encode()
    return {"main/binary-amd64/Packages": data, "main/binary-amd64/Packages.gz": gzip.compress(data, mtime=0)}


def test_release_problems_accepts_matching_release() -> None:
    fields = mirror.release_fields("bookworm")
    files = _index_files()
    assert mirror.release_problems(_release_text(fields, files), fields, files) == []


def test_release_problems_catches_wrong_field_and_stale_hash() -> None:
    fields = mirror.release_fields("bookworm")
    files = _index_files()
    release = _release_text({**fields, "Origin": "Debian"}, files)
    changed = {**files, "main/binary-amd64/Packages": files["main/binary-amd64/Packages"] + b"\n"}
    problems = mirror.release_problems(release, fields, changed)
    assert "Release Origin: 'Debian', wanted 'gpu-lab'" in problems
    assert "Release SHA256 entry for main/binary-amd64/Packages does not match the file" in problems
    assert len(problems) == 2


def test_release_problems_catches_unlisted_index() -> None:
    fields = mirror.release_fields("bookworm")
    files = _index_files()
    release = _release_text(fields, {"main/binary-amd64/Packages": files["main/binary-amd64/Packages"]})
    assert mirror.release_problems(release, fields, files) == ["Release lists no SHA256 for main/binary-amd64/Packages.gz"]


def test_release_fields_match_the_brief() -> None:
    fields = mirror.release_fields("bookworm")
    assert {key: fields[key] for key in ("Origin", "Suite", "Codename", "Components", "Architectures")} == {
        "Origin": "gpu-lab", "Suite": "bookworm", "Codename": "bookworm", "Components": "main", "Architectures": "amd64",
    }


def test_mirror_inputs_digest_tracks_packages_and_key_not_order() -> None:
    debs = mirror.non_main(mirror.parse_print_uris(PRINT_URIS))
    base = mirror.mirror_inputs_digest("bookworm", "FPR1", debs)
    assert base == mirror.mirror_inputs_digest("bookworm", "FPR1", list(reversed(debs)))
    assert base != mirror.mirror_inputs_digest("bookworm", "FPR2", debs)
    assert base != mirror.mirror_inputs_digest("trixie", "FPR1", debs)
    changed = [dataclasses.replace(debs[0], hash_value="00"), *debs[1:]]
    assert base != mirror.mirror_inputs_digest("bookworm", "FPR1", changed)


def test_lay_out_pool_links_wanted_and_drops_stale(tmp_path: Path) -> None:
    downloads, pool = tmp_path / "downloads", tmp_path / "pool"
    downloads.mkdir()
    pool.mkdir()
    (downloads / "a_1_amd64.deb").write_bytes(b"a")
    (pool / "old_1_amd64.deb").write_bytes(b"old")
    deb = mirror.DebUri("http://m/pool/non-free/a/a_1_amd64.deb", "a_1_amd64.deb", 1, "sha256", "x")
    mirror.lay_out_pool([deb], downloads, pool)
    assert sorted(path.name for path in pool.iterdir()) == ["a_1_amd64.deb"]
    assert (pool / "a_1_amd64.deb").stat().st_ino == (downloads / "a_1_amd64.deb").stat().st_ino


# --- command line ----------------------------------------------------------------------------


def test_parser_choices_and_defaults() -> None:
    parser = labctl.build_parser()
    assert parser.parse_args(["images", "--only", "debian13"]).only == "debian13"
    with pytest.raises(SystemExit):
        parser.parse_args(["images", "--only", "debian11"])
    args = parser.parse_args(["mirror"])
    assert (args.suite, args.dest, args.verify, args.no_verify) == ("bookworm", None, False, False)
    assert parser.parse_args(["mirror", "--suite", "trixie"]).suite == "trixie"
    with pytest.raises(SystemExit):
        parser.parse_args(["mirror", "--suite", "sid"])
    with pytest.raises(SystemExit):
        parser.parse_args(["mirror", "--verify", "--no-verify"])


def test_require_tools_names_missing_tool_and_package() -> None:
    with pytest.raises(_common.LabError, match=r"no-such-tool-xyz \(package pkg-xyz\)"):
        _common.require_tools({"no-such-tool-xyz": "pkg-xyz", "sh": "dash"})


def test_run_failure_names_command() -> None:
    with pytest.raises(_common.LabError, match="exit 3.*sh -c"):
        _common.run(["sh", "-c", "echo boom >&2; exit 3"])
    with pytest.raises(_common.LabError, match="not found"):
        _common.run(["no-such-binary-xyz"])


# --- the mirror's package sets: read from the nvidia_driver role's vars ------------------------


def test_mirror_package_sets_for_bookworm_are_debian_12_distribution_catalog() -> None:
    """Built by hand from the role's file: each branch, each flavour in the file's order, then its persistenced."""
    role_vars = yaml.safe_load((LAB_DIR.parent / "roles/nvidia_driver/vars/Debian-12.yml").read_text())
    wanted = []
    for series in role_vars["_nvidia_driver_catalogs"]["distribution"]["series"].values():
        for flavour, packages in series.items():
            if flavour != "persistenced":
                wanted.append(tuple(packages) + tuple(series.get("persistenced", [])))
    assert mirror.mirror_package_sets()["bookworm"] == tuple(wanted)
    assert ("nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libnvidia-cfg1",
            "nvidia-persistenced") in mirror.mirror_package_sets()["bookworm"]


def test_mirror_package_sets_one_per_suite_from_its_vars_file() -> None:
    sets = mirror.mirror_package_sets()
    assert list(sets) == list(mirror.MIRROR_SUITE_VARS) == ["bookworm", "trixie"]
    assert mirror.MIRROR_SUITE_VARS == {"bookworm": "Debian-12.yml", "trixie": "Debian-13.yml"}
    assert sets["trixie"] == mirror.driver_package_sets(mirror.DRIVER_VARS_DIR / "Debian-13.yml")
    assert all(package_set and all(isinstance(name, str) for name in package_set)
               for suite_sets in sets.values() for package_set in suite_sets)


def test_driver_package_sets_keep_the_file_order_and_add_persistenced(tmp_path: Path) -> None:
    vars_file = tmp_path / "Debian-12.yml"
    vars_file.write_text("""
_nvidia_driver_catalogs:
  cuda_repo:
    series:
      "*": {proprietary: ["cuda-drivers-{{ _nvidia_driver_branch }}"]}
  distribution:
    series:
      "550":
        open: [drv, open-dkms]
        persistenced: [pd]
        proprietary: [drv, dkms]
      "470":
        proprietary: [tesla-drv]
""")
    assert mirror.driver_package_sets(vars_file) == (("drv", "open-dkms", "pd"), ("drv", "dkms", "pd"), ("tesla-drv",))


def test_driver_package_sets_refuse_a_jinja_value(tmp_path: Path) -> None:
    vars_file = tmp_path / "Debian-12.yml"
    vars_file.write_text("""
_nvidia_driver_catalogs:
  distribution:
    series:
      "535":
        proprietary: [nvidia-driver, "nvidia-kernel-{{ _nvidia_driver_branch }}-dkms"]
        persistenced: [nvidia-persistenced]
""")
    with pytest.raises(_common.LabError) as error:
        mirror.driver_package_sets(vars_file)
    assert str(vars_file) in str(error.value)
    assert "_nvidia_driver_catalogs.distribution.series.535.proprietary" in str(error.value)
    assert "{{ _nvidia_driver_branch }}" in str(error.value)


def test_driver_package_sets_refuse_a_file_without_the_catalog(tmp_path: Path) -> None:
    vars_file = tmp_path / "Debian-12.yml"
    vars_file.write_text("_nvidia_driver_pkg_mgr: apt\n")
    with pytest.raises(_common.LabError, match=r"Debian-12\.yml has no mapping _nvidia_driver_catalogs\.distribution"):
        mirror.driver_package_sets(vars_file)


# --- labctl up/down at a port offset ---------------------------------------------------


def test_a_lab_beside_the_default_one_never_starts_or_removes_the_node_containers(monkeypatch, tmp_path) -> None:
    """The node containers (fixed names, one set a machine) are the lab at offset 0's: `labctl down` of a CI lane's
    or a bench lab's control plane must leave them, the mirror server and the network to it."""
    import argparse

    import config as lab_config
    import nodes

    beside = lab_config.load(environ={"GPU_LAB_PORT_OFFSET": "6000"})
    default = lab_config.load(environ={})
    assert not beside.node_containers and default.node_containers

    class FakeCluster:
        def control_plane_down(self, config):  # noqa: ANN001, ANN202
            return []

    removed: list[str] = []
    monkeypatch.setattr(labctl, "_cluster", FakeCluster)
    monkeypatch.setattr(labctl, "FACT_CACHE", tmp_path / "facts")
    (tmp_path / "facts").mkdir()
    monkeypatch.setattr(nodes, "down", lambda: removed.append("nodes"))
    monkeypatch.setattr(labctl, "_config", lambda args: beside)
    labctl.cmd_down(argparse.Namespace())
    assert removed == [] and (tmp_path / "facts").is_dir()
    monkeypatch.setattr(labctl, "_config", lambda args: default)
    labctl.cmd_down(argparse.Namespace())
    assert removed == ["nodes"] and not (tmp_path / "facts").exists()


# --- the unit tests' oracles -----------------------------------------------------------


def _fake_gobuild(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, ...]]:
    """gobuild.ensure_builds answered from a cache of empty binaries under tmp_path; returns the calls made."""
    import gobuild

    monkeypatch.setenv("GPU_LAB_CACHE", str(tmp_path))
    monkeypatch.delenv("DEVICE_PLUGIN_CONFIG_CHECK", raising=False)
    monkeypatch.delenv("KUEUE_VALIDATE", raising=False)
    calls: list[tuple[str, ...]] = []

    def ensure_builds(names):
        calls.append(tuple(names))
        builds = {}
        for name in names:
            directory = tmp_path / "bin" / f"{name}-v1.0.0-abc"
            directory.mkdir(parents=True, exist_ok=True)
            builds[name] = gobuild.Build(gobuild.COMPONENTS[name], "v1.0.0", directory)
        return builds

    monkeypatch.setattr(tools.gobuild, "ensure_builds", ensure_builds)
    return calls


def test_oracles_builds_the_four_side_by_side_then_links_each_as_its_own_command(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calls = _fake_gobuild(monkeypatch, tmp_path)
    for command in ("cdi-validate", "device-plugin-config", "nvml-mig-mocks", "kueue-validate"):
        args = labctl.build_parser().parse_args([command])
        args.func(args)
    one_by_one = capsys.readouterr()
    assert calls == [("cdi-validate",), ("device-plugin-config",), ("nvml-mig-mocks",), ("kueue-validate",)]
    links = sorted((tmp_path / "bin").glob("*"))
    for link in links:
        if link.is_symlink():
            link.unlink()
    calls.clear()

    args = labctl.build_parser().parse_args(["oracles"])
    args.func(args)
    together = capsys.readouterr()
    # One build call for the four first (side by side), then each command's own build-and-link, found cached.
    assert calls[0] == ("cdi-validate", "device-plugin-config", "nvml-mig-mocks", "kueue-validate")
    assert calls[1:] == [("cdi-validate",), ("device-plugin-config",), ("nvml-mig-mocks",), ("kueue-validate",)]
    assert (together.out, together.err) == (one_by_one.out, one_by_one.err)
    assert "cdi-validate -> cdi-validate-v1.0.0-abc/cdi-validate: tags.cncf.io/container-device-interface v1.0.0" in \
        together.out + together.err
    for name, binary in (("cdi-validate", "cdi-validate"), ("device-plugin-config-check", "device-plugin-config-check"),
                         ("nvml-mig-mocks", "nvml-mig-mocks"), ("kueue-validate", "kueue-validate")):
        assert (tmp_path / "bin" / name).is_symlink(), name
        assert (tmp_path / "bin" / name).resolve().name == binary
