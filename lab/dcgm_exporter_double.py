"""gpu-lab DOUBLE of NVIDIA's DCGM exporter's /metrics, and a real Prometheus (Debian's, `labctl promtool` unpacks it)
that scrapes it on 127.0.0.1: what the GPU health check's Prometheus source (gpu_health_prometheus_url) reads in the
tests. The lab's simulated nodes have no GPUs, so no real exporter runs; the series have the exporter's names, types
and labels (gpu, UUID, pci_bus_id, device, modelName, hostname) plus `node`, which the prometheus role's relabelling
adds. Those are the labels of exporter 4.6.0-4.8.3, the release roles/dcgm_exporter pins, which renamed the host label
Hostname to hostname (NVIDIA/dcgm-exporter#655); `Series(..., host_label="Hostname")` serves a series as releases up
to 4.5.3-4.8.2 label it.

    with ExporterDouble() as exporter, LocalPrometheus(exporter.target) as prometheus:
        exporter.set_series([Series("DCGM_FI_DEV_XID_ERRORS", "gpu-h100-0", 3, 79)])
        prometheus.wait_for("DCGM_FI_DEV_XID_ERRORS == 79")
        ... prometheus.url ...

The HELP and TYPE lines are those of the role's counters file (roles/dcgm_exporter/vars/main.yml), and values are in
the exporter's units: a violation counter counts nanoseconds throttled (`throttled()` makes one that grows by the
given share of each second, in nanoseconds). Standard library and PyYAML (the project's virtualenv).
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Sequence

import yaml

from _common import LabError, prometheus_path

COUNTERS_FILE = Path(__file__).resolve().parents[1] / "roles" / "dcgm_exporter" / "vars" / "main.yml"
# The exporter's unit of the DCGM_FI_DEV_*_VIOLATION counters: nanoseconds (its counters file says "(in ns)"; the
# fixture tests/unit/fixtures/dcgm_exporter/default-counters.yml records that).
NANOSECONDS_PER_SECOND = 1e9


def _fields() -> dict[str, tuple[str, str]]:
    """field -> (type, help), as the role's counters file gives them to the exporter (label fields print no series)."""
    counters = yaml.safe_load(COUNTERS_FILE.read_text())["_dcgm_exporter_default_counters"]
    return {counter["field"]: (counter["type"], counter["help"]) for counter in counters if counter["type"] != "label"}


FIELDS = _fields()


@dataclasses.dataclass(frozen=True)
class Series:
    field: str
    node: str
    gpu: int
    value: float
    model: str = "NVIDIA H100 80GB HBM3"
    per_second: float = 0.0  # a counter's growth per second, in the exporter's unit, from when the series was set
    host_label: str = "hostname"  # the exporter's host label: hostname from 4.6.0-4.8.3 on, Hostname before

    def line(self, elapsed: float = 0.0) -> str:
        if self.host_label not in ("hostname", "Hostname"):
            raise LabError(f"host_label={self.host_label!r}; allowed: hostname (exporter 4.6.0-4.8.3 on) or Hostname")
        labels = {"gpu": str(self.gpu), "UUID": f"GPU-{self.node}-{self.gpu}",
                  "pci_bus_id": f"00000000:{self.gpu + 0x18:02X}:00.0", "device": f"nvidia{self.gpu}",
                  "modelName": self.model, self.host_label: f"dcgm-exporter-{self.node}", "node": self.node}
        text = ",".join(f'{key}="{value}"' for key, value in labels.items())
        return f"{self.field}{{{text}}} {self.value + self.per_second * elapsed:.17g}"


def throttled(field: str, node: str, gpu: int, share: float) -> Series:
    """A violation counter of a GPU held back `share` of the time: it grows by share x 1e9 nanoseconds a second."""
    if not (field.startswith("DCGM_FI_DEV_") and field.endswith("_VIOLATION")):
        raise LabError(f"throttled(): {field} is not a DCGM violation counter")
    return Series(field, node, gpu, 0.0, per_second=share * NANOSECONDS_PER_SECOND)


def exposition(series: Sequence[Series], elapsed: float = 0.0) -> str:
    unknown = sorted({item.field for item in series} - set(FIELDS))
    if unknown:
        raise LabError(f"the DCGM exporter double serves only the role's counters; not among them: {unknown}")
    lines = []
    for field, (kind, help_text) in FIELDS.items():
        lines += [f"# HELP {field} {help_text}", f"# TYPE {field} {kind}"]
        lines += [item.line(elapsed) for item in series if item.field == field]
    return "\n".join(lines) + "\n"


class ExporterDouble:
    """Serves the exposition of the series last set, on 127.0.0.1 (a free port)."""

    def __init__(self) -> None:
        self._series: Sequence[Series] = []
        self._since = time.monotonic()
        self._text: str | None = None  # set_text's exposition, served as given
        self._extra = ""
        double = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = double.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = "127.0.0.1:%d" % self._server.server_address[1]

    def text(self) -> str:
        if self._text is not None:
            return self._text
        return exposition(self._series, time.monotonic() - self._since) + self._extra

    def set_series(self, series: Sequence[Series], extra: str = "") -> None:
        """Serve these series (counters growing from now); `extra`: exposition lines served after them as given."""
        exposition(series)  # refuses a field the role does not enable, here rather than at the scrape
        self._series, self._since, self._text, self._extra = list(series), time.monotonic(), None, extra

    def set_text(self, text: str) -> None:
        self._text = text

    def __enter__(self) -> "ExporterDouble":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalPrometheus:
    """A real Prometheus scraping one target every second, its TSDB in a temporary directory."""

    def __init__(self, target: str) -> None:
        self.binary = prometheus_path()
        if not self.binary.exists():
            raise LabError(f"prometheus not found at {self.binary}: run `lab/labctl.py promtool`")
        self.target, self.port = target, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._work = tempfile.TemporaryDirectory(prefix="gpu-lab-prometheus-")
        self._process: subprocess.Popen | None = None

    def query(self, expression: str) -> list:
        address = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expression})}"
        with urllib.request.urlopen(address, timeout=5) as answer:
            return json.loads(answer.read())["data"]["result"]

    def wait_for(self, expression: str, timeout: float = 60.0) -> list:
        """Until the query returns something (the scrape happened); LabError after timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                found = self.query(expression)
                if found:
                    return found
            except OSError:
                pass
            if self._process is not None and self._process.poll() is not None:
                raise LabError(f"prometheus exited with {self._process.returncode}")
            if time.monotonic() > deadline:
                raise LabError(f"prometheus: nothing for {expression} after {timeout:.0f} s")
            time.sleep(0.5)

    def __enter__(self) -> "LocalPrometheus":
        work = Path(self._work.name)
        (work / "prometheus.yml").write_text(json.dumps({
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "dcgm-exporter", "honor_labels": True,
                                "static_configs": [{"targets": [self.target]}]}]}))
        self._process = subprocess.Popen(
            [str(self.binary), f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.wait_for("up")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=30)
        self._work.cleanup()
