"""The lab network's checks: the probe each node container runs against the mirror, and what it reports."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))

import nodes  # noqa: E402


@pytest.fixture
def served_key(tmp_path: Path):
    (tmp_path / "gpu-lab-mirror.asc").write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n", encoding="utf-8")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def log_message(self, *args) -> None:  # noqa: ANN002
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://localhost:{server.server_address[1]}"
    server.shutdown()


def probe(url: str) -> subprocess.CompletedProcess[str]:
    """The probe exactly as a node container runs it (python3 of the image; here the host's)."""
    return subprocess.run(nodes.reach_probe(url), capture_output=True, text=True, timeout=60, check=False)


def test_probe_succeeds_when_the_name_resolves_and_the_file_is_served(served_key: str) -> None:
    result = probe(f"{served_key}/gpu-lab-mirror.asc")
    assert (result.returncode, result.stdout.strip()) == (0, "ok")


def test_probe_names_resolution_as_the_failing_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodes, "PROBE_TIMEOUT_S", 0)
    result = probe("http://gpu-lab-mirror.invalid:8080/gpu-lab-mirror.asc")
    assert result.returncode == 1
    assert result.stdout.startswith("resolve: ")
    message = nodes.probe_problem("gpu-h100-0", "http://gpu-lab-mirror.invalid:8080/x", result.stdout)
    assert message.startswith("gpu-h100-0: cannot resolve 'gpu-lab-mirror.invalid'")
    assert "netavark" in message and "labctl prereqs" in message


def test_probe_names_the_fetch_when_the_name_resolves(served_key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodes, "PROBE_TIMEOUT_S", 0)
    url = f"{served_key}/missing.asc"
    result = probe(url)
    assert result.returncode == 1 and result.stdout.startswith("fetch: ")
    message = nodes.probe_problem("gpu-a100-0", url, result.stdout)
    assert message.startswith("gpu-a100-0: resolves 'localhost' but cannot fetch " + url)
    assert "404" in message


def test_network_dns_reads_podman_inspect() -> None:
    assert nodes.network_dns('[{"name": "gpu-lab", "dns_enabled": true}]') is True
    assert nodes.network_dns('[{"name": "gpu-lab", "dns_enabled": false}]') is False
    assert nodes.network_dns("[]") is None
