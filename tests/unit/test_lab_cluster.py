"""The lab control plane's pure parts: its config, the Go build recipe, certificates, kwok config and node objects.

The processes themselves are exercised against the real binaries by tests/integration.
"""

from __future__ import annotations

import copy
import ipaddress
import sys
from pathlib import Path

import pytest
import yaml
from cryptography import x509

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lab"))

import cluster  # noqa: E402
import config as lab_config  # noqa: E402
import gobuild  # noqa: E402
import pki  # noqa: E402
from _common import LabError  # noqa: E402

DEFAULT = yaml.safe_load((ROOT / "lab" / "lab.yml").read_text())


def configured(**changes) -> dict:
    data = copy.deepcopy(DEFAULT)
    for dotted, value in changes.items():
        target = data
        keys = dotted.split("__")
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[keys[-1]] = value
    return data


# -- lab.yml -----------------------------------------------------------------------------------------------------------


def test_default_lab_has_the_issue_pools():
    config = lab_config.load()
    assert [name for name, _ in config.nodes()] == ["gpu-h100-0", "gpu-h100-1", "gpu-a100-0", "cpu-0"]
    assert config.gpu_nodes() == ["gpu-h100-0", "gpu-h100-1", "gpu-a100-0"]
    assert config.host_nodes() == ["gpu-h100-0", "gpu-h100-1", "gpu-a100-0"]
    assert config.pool_of("gpu-a100-0").gpu.count == 4
    assert config.pool_of("cpu-0").gpu is None


def test_lab_inventory_matches_the_host_pools():
    inventory = yaml.safe_load((ROOT / "inventories" / "lab" / "hosts.yml").read_text())
    listed = sorted(inventory["all"]["children"]["gpu_nodes"]["hosts"])
    assert listed == sorted(lab_config.load().host_nodes())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"control_plane__ports__kube_apiserver": 80}, "control_plane.ports.kube_apiserver=80"),
        ({"control_plane__ports__kwok": 12379}, "a different port for each component"),
        ({"control_plane__service_cidr": "10.96.0.0/99"}, "control_plane.service_cidr='10.96.0.0/99'"),
        ({"control_plane__pod_cidr": "fd00::/64"}, "control_plane.pod_cidr='fd00::/64'"),
        ({"node_pools__0__prefix": "GPU_H100"}, "node_pools[0].prefix='GPU_H100'"),
        ({"node_pools__0__count": -1}, "node_pools[0].count=-1"),
        ({"node_pools__0__count": "2"}, "node_pools[0].count='2'"),
        ({"node_pools__1__gpu__count": 0}, "node_pools[1].gpu.count=0"),
        ({"node_pools__1__gpu__mig_capable": "yes"}, "node_pools[1].gpu.mig_capable='yes'"),
        ({"node_pools__2__memory": "lots"}, "node_pools[2].memory='lots'"),
        ({"node_pools__1__prefix": "gpu-h100"}, "pools 'gpu-h100' and 'gpu-h100' clash"),
        ({"node_pools": []}, "node_pools=[]"),
    ],
)
def test_bad_lab_config_names_key_and_value(changes, message):
    with pytest.raises(LabError) as caught:
        lab_config.parse_config(configured(**changes))
    assert message in str(caught.value)
    assert "allowed" in str(caught.value)


def test_unknown_port_key_is_refused():
    data = configured()
    data["control_plane"]["ports"]["kubelet"] = 10250
    with pytest.raises(LabError, match="kubelet"):
        lab_config.parse_config(data)


def test_a_port_offset_shifts_every_port_for_a_second_lab():
    base = lab_config.load(environ={})
    shifted = lab_config.load(environ={"GPU_LAB_PORT_OFFSET": "1000"})
    assert {name: port + 1000 for name, port in base.ports.items()} == shifted.ports
    assert shifted.pools == base.pools


@pytest.mark.parametrize("value", ["-5", "1e3", "20001", "x"])
def test_a_bad_port_offset_is_named_with_its_value(value):
    with pytest.raises(LabError, match=f"GPU_LAB_PORT_OFFSET={value!r} is not valid; allowed: an integer from 0"):
        lab_config.load(environ={"GPU_LAB_PORT_OFFSET": value})


# -- Go builds ------------------------------------------------------------------------------------------------------


def test_each_component_pins_its_upstream_in_go_mod_and_go_sum():
    for component in gobuild.COMPONENTS.values():
        go_mod = (component.source_dir / "go.mod").read_text()
        assert gobuild.pinned_version(go_mod, component.module).startswith("v")
        for package in component.packages:
            assert package in go_mod, f"{package} is not a tool line of {component.source_dir}/go.mod"
        assert (component.source_dir / "go.sum").stat().st_size > 0


def test_kubernetes_replaces_every_staging_module_with_the_matching_release():
    go_mod = (gobuild.COMPONENTS["kubernetes"].source_dir / "go.mod").read_text()
    version = gobuild.pinned_version(go_mod, "k8s.io/kubernetes")
    staging = "v0." + version.split(".", 1)[1]
    replaces = [line.split() for line in go_mod.splitlines() if "=>" in line]
    assert len(replaces) >= 30
    assert all(parts[0] == parts[2] and parts[3] == staging for parts in replaces)


def test_version_flags_name_the_release():
    component = gobuild.COMPONENTS["kubernetes"]
    flags = gobuild.ldflags(component, "v1.37.2")
    assert "k8s.io/component-base/version.gitVersion=v1.37.2" in flags
    assert "gitMajor=1" in flags and "gitMinor=37" in flags
    assert gobuild.ldflags(gobuild.COMPONENTS["etcd"], "v3.6.16") == "-s -w"


def test_build_digest_changes_with_every_input():
    base = gobuild.build_digest(b"mod", b"sum", "go1.26.8", "-s")
    assert base == gobuild.build_digest(b"mod", b"sum", "go1.26.8", "-s")
    others = {gobuild.build_digest(b"mod2", b"sum", "go1.26.8", "-s"),
              gobuild.build_digest(b"mod", b"sum2", "go1.26.8", "-s"),
              gobuild.build_digest(b"mod", b"sum", "go1.27.0", "-s"),
              gobuild.build_digest(b"mod", b"sum", "go1.26.8", "-s -w"),
              gobuild.build_digest(b"mod", b"sum", "go1.26.8", "-s", b"main.go\0package main")}
    assert base not in others and len(others) == 5


def test_a_program_of_ours_is_rebuilt_when_its_source_changes(tmp_path, monkeypatch):
    component = gobuild.Component("ours", "example.com/x", ("gpu-lab/ours",), ("ours",))
    monkeypatch.setattr(gobuild, "GO_DIR", tmp_path)
    (tmp_path / "ours").mkdir()
    for name, text in (("go.mod", "module gpu-lab/ours\n\nrequire example.com/x v1.0.0\n"), ("go.sum", ""),
                       ("main.go", "package main\n")):
        (tmp_path / "ours" / name).write_text(text)
    before = gobuild.planned_build(component, tmp_path, "go1.26.8")
    (tmp_path / "ours" / "main.go").write_text("package main\n\nfunc main() {}\n")
    after = gobuild.planned_build(component, tmp_path, "go1.26.8")
    assert before.version == "v1.0.0" and before.directory != after.directory
    # Upstream-only components (no *.go of ours) keep the digests their cached builds were made under.
    (tmp_path / "ours" / "main.go").unlink()
    upstream = component
    assert gobuild.planned_build(upstream, tmp_path, "go1.26.8").directory.name == (
        "ours-v1.0.0-" + gobuild.build_digest(b"module gpu-lab/ours\n\nrequire example.com/x v1.0.0\n", b"",
                                              "go1.26.8", gobuild.build_settings(upstream, "v1.0.0")))


def test_pinned_version_fails_clearly_for_a_missing_module():
    with pytest.raises(LabError, match="does not require example.com/x"):
        gobuild.pinned_version("module a\n\nrequire b v1.0.0\n", "example.com/x")


def test_a_new_build_removes_only_its_own_components_older_builds():
    # containerd's 2.2 and 2.4 lines are two components, one name the start of the other's: building one must not
    # take the other's build for its own older pin (a glob "containerd-*" did).
    assert gobuild.is_build_of("containerd-v2.2.8-0123456789ab", "containerd")
    assert gobuild.is_build_of("containerd-v2.2.9-7ada60a5f9e9.partial", "containerd")
    assert not gobuild.is_build_of("containerd-2.4-v2.4.2-d4cb0861ac4a", "containerd")
    assert gobuild.is_build_of("containerd-2.4-v2.4.1-d4cb0861ac4a", "containerd-2.4")
    assert not gobuild.is_build_of("containerd-v2.2.9-7ada60a5f9e9", "containerd-2.4")
    assert not gobuild.is_build_of("containerd2", "containerd") and not gobuild.is_build_of("containerd2.4", "containerd")
    assert gobuild.is_build_of("promtool-v0.316.0-3e50e9ea747f", "promtool")
    assert gobuild.is_build_of("kueue-v0.17.0-0123456789ab", "kueue")


def test_progress_counts_compiled_packages_not_downloads():
    progress = gobuild._Progress()
    for line in ("go: downloading k8s.io/api v0.37.2", "k8s.io/api/core/v1", "# k8s.io/x", "\tnote", "k8s.io/apiserver"):
        progress.feed(line)
    assert (progress.packages, progress.downloads, progress.last) == (2, 1, "k8s.io/apiserver")


# -- certificates ---------------------------------------------------------------------------------------------------


def test_pki_issues_every_identity_and_keeps_it_on_a_second_run(tmp_path):
    configs = pki.ensure_pki(tmp_path, cluster="gpu-lab", server="https://127.0.0.1:16443",
                             service_cidr="10.96.0.0/16")
    assert set(configs) == {"admin", "controller-manager", "scheduler", "kwok", "device-plugin-double",
                            "dra-driver-double", "controller-runner"}
    server = x509.load_pem_x509_certificate((tmp_path / "apiserver.crt").read_bytes())
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert ipaddress.ip_address("10.96.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    scheduler = x509.load_pem_x509_certificate((tmp_path / "scheduler.crt").read_bytes())
    assert scheduler.subject.rfc4514_string() == "CN=system:kube-scheduler"
    admin = x509.load_pem_x509_certificate((tmp_path / "admin.crt").read_bytes())
    assert "O=system:masters" in admin.subject.rfc4514_string()
    kubeconfig = yaml.safe_load(configs["admin"].read_text())
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:16443"
    assert (tmp_path / "ca.key").stat().st_mode & 0o077 == 0
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    pki.ensure_pki(tmp_path, cluster="gpu-lab", server="https://127.0.0.1:16443", service_cidr="10.96.0.0/16")
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


def test_a_new_port_rewrites_kubeconfigs_but_keeps_the_keys(tmp_path):
    pki.ensure_pki(tmp_path, cluster="gpu-lab", server="https://127.0.0.1:16443", service_cidr="10.96.0.0/16")
    key = (tmp_path / "admin.key").read_bytes()
    configs = pki.ensure_pki(tmp_path, cluster="gpu-lab", server="https://127.0.0.1:26443",
                             service_cidr="10.96.0.0/16")
    assert "https://127.0.0.1:26443" in configs["admin"].read_text()
    assert (tmp_path / "admin.key").read_bytes() == key


# -- processes, kwok and nodes ----------------------------------------------------------------------------------------


def fake_builds(tmp_path):
    return {name: gobuild.Build(component, "v0", tmp_path / name) for name, component in gobuild.COMPONENTS.items()}


def test_control_plane_flags(tmp_path):
    config = lab_config.load()
    paths = cluster.Paths(tmp_path)
    procs = {p.name: p for p in cluster.processes(config, fake_builds(tmp_path), paths, "/venv/bin/python")}
    assert list(procs) == list(cluster.PROGRAMS)
    apiserver = procs["kube-apiserver"].argv
    assert "--bind-address=127.0.0.1" in apiserver and "--secure-port=16443" in apiserver
    assert "--authorization-mode=Node,RBAC" in apiserver
    assert "--enable-admission-plugins=NodeRestriction" in apiserver
    assert not any(flag.startswith("--disable-admission-plugins") for flag in apiserver)
    assert not any("insecure" in flag for flag in apiserver)
    for name in ("kube-controller-manager", "kube-scheduler"):
        assert "--bind-address=127.0.0.1" in procs[name].argv
    assert "--listen-client-urls=http://127.0.0.1:12379" in procs["etcd"].argv
    assert f"--config={paths.kwok_config}" in procs["kwok"].argv
    for name, program in cluster.PROGRAMS.items():
        assert cluster.program_name(procs[name].argv) == program


def test_program_name_tells_scripts_from_binaries():
    assert cluster.program_name(["/x/bin/kube-apiserver", "--a"]) == "kube-apiserver"
    assert cluster.program_name(["/venv/bin/python3", "/p/lab/device_plugin_double.py"]) == "device_plugin_double.py"
    assert cluster.program_name([]) == ""


def test_kwok_config_holds_options_and_the_upstream_stages(tmp_path):
    for relative in cluster.KWOK_STAGES:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata:\n  name: {path.stem}\n")
    documents = list(yaml.safe_load_all(cluster.kwok_config(tmp_path)))
    assert documents[0]["kind"] == "KwokConfiguration"
    assert [doc["metadata"]["name"] for doc in documents[1:]] == [Path(s).stem for s in cluster.KWOK_STAGES]
    # Only pod-complete learns to leave a held pod Running; the other stages are upstream's as they are.
    hold = {"key": '.metadata.annotations["gpu-lab.dev/hold-running"]', "operator": "DoesNotExist"}
    for doc in documents[1:]:
        expressions = doc.get("spec", {}).get("selector", {}).get("matchExpressions", [])
        assert (hold in expressions) == (doc["metadata"]["name"] == "pod-complete"), doc
    (tmp_path / cluster.KWOK_STAGES[0]).unlink()
    with pytest.raises(LabError, match="node-initialize"):
        cluster.kwok_config(tmp_path)


def test_gpu_node_is_registered_without_gpus_and_with_its_hardware_as_annotations():
    config = lab_config.load()
    node = cluster.node_manifest("gpu-a100-0", config.pool_of("gpu-a100-0"))
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert node["metadata"]["annotations"]["gpu-lab.dev/gpu-count"] == "4"
    assert node["metadata"]["labels"]["gpu-lab.dev/pool"] == "gpu-a100"
    assert not any(key.startswith("nvidia.com/") for key in node["status"]["capacity"])
    cpu = cluster.node_manifest("cpu-0", config.pool_of("cpu-0"))
    assert not any(key.startswith("gpu-lab.dev/gpu") for key in cpu["metadata"]["annotations"])


def test_node_plan_creates_missing_and_removes_only_lab_nodes():
    config = lab_config.load()
    existing = {"gpu-h100-0": {"gpu-lab.dev/pool": "gpu-h100"}, "gpu-h100-9": {"gpu-lab.dev/pool": "gpu-h100"},
                "someone-elses": {}}
    create, delete = cluster.node_plan(config, existing)
    assert create == ["gpu-h100-1", "gpu-a100-0", "cpu-0"]
    assert delete == ["gpu-h100-9"]


def test_a_taken_port_is_named_with_its_config_key(tmp_path, monkeypatch):
    import socket

    monkeypatch.setattr(cluster, "PORT_RELEASE_S", 0.5)

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        data = configured(control_plane__ports__kwok=port)
        config = lab_config.parse_config(data)
        kwok = next(p for p in cluster.processes(config, fake_builds(tmp_path), cluster.Paths(tmp_path), "py")
                    if p.name == "kwok")
        with pytest.raises(LabError, match=f"127.0.0.1:{port} is taken .*control_plane.ports"):
            cluster.check_port(config, kwok)


def test_format_table_aligns_columns():
    text = cluster.format_table([{"a": "x", "b": "long value"}, {"a": "yy", "b": "z"}], [("a", "A"), ("b", "B")])
    assert text.splitlines() == ["A   B", "x   long value", "yy  z"]


def test_go_output_names_follow_go_build():
    assert gobuild.go_output_name("k8s.io/kubernetes/cmd/kube-apiserver") == "kube-apiserver"
    assert gobuild.go_output_name("go.etcd.io/etcd/server/v3") == "server"


def test_lab_inventory_promises_the_pools_gpu_counts():
    inventory = yaml.safe_load((ROOT / "inventories" / "lab" / "hosts.yml").read_text())
    hosts = inventory["all"]["children"]["gpu_nodes"]["hosts"]
    config = lab_config.load()
    assert {name: vars_["gpu_validation_expected_gpu_count"] for name, vars_ in hosts.items()} == {
        name: config.pool_of(name).gpu.count for name in config.host_nodes()}


def test_each_lab_offset_gets_a_pod_network_of_its_own() -> None:
    """Kueue serves its webhook on its pod's IP, put on the host's loopback: two labs side by side (CI's lanes) must
    never hand out the same pod IP."""
    import config as lab_config

    base = lab_config.load()
    assert base.pod_cidr == "10.244.0.0/16"
    lane2 = lab_config.load(environ={"GPU_LAB_PORT_OFFSET": "5000"})
    lane3 = lab_config.load(environ={"GPU_LAB_PORT_OFFSET": "6000"})
    bench = lab_config.load(environ={"GPU_LAB_PORT_OFFSET": "1000"})
    assert lane2.pod_cidr == "10.194.0.0/16" and lane3.pod_cidr == "10.184.0.0/16" and bench.pod_cidr == "10.234.0.0/16"
    assert lab_config.shifted_pod_cidr("10.244.0.0/16", 20000) == "10.44.0.0/16"
    with pytest.raises(lab_config.LabError, match="below 0.0.0.0"):
        lab_config.shifted_pod_cidr("0.0.0.0/8", 100)


def test_only_the_lab_at_offset_0_reads_the_node_containers(tmp_path):
    """The node containers have fixed names, one set per machine, and are the default lab's. A lab beside it (CI's
    lanes 2 and 3) once read a GPU fault that lane 1 had injected into gpu-h100-0 and advertised 7 GPUs there."""
    def doubles(environ):
        config = lab_config.load(environ=environ)
        procs = {p.name: p.argv for p in cluster.processes(config, fake_builds(tmp_path), cluster.Paths(tmp_path), "py")}
        return procs["device-plugin-double"], procs["dra-driver-double"]

    assert all("--no-node-containers" not in argv for argv in doubles({}))
    assert all("--no-node-containers" in argv for argv in doubles({"GPU_LAB_PORT_OFFSET": "6000"}))
    assert lab_config.load(environ={"GPU_LAB_PORT_OFFSET": "5000"}).port_offset == 5000
