"""gpu-lab DOUBLE of NVIDIA's DCGM exporter's /metrics, and a real Prometheus (Debian's, `labctl promtool` unpacks it)
that scrapes it on 127.0.0.1: what the GPU health check's Prometheus source (gpu_health_prometheus_url) reads in the
tests. The lab's simulated nodes have no GPUs, so no real exporter runs; the series have the exporter's names, types
and labels (gpu, UUID, device, modelName, Hostname) plus `node`, which the prometheus role's relabelling adds. Those
are the labels of the exporter releases 3.x to 4.8.2, the one roles/dcgm_exporter pins (4.8.3 renames Hostname to
hostname).

    with ExporterDouble() as exporter, LocalPrometheus(exporter.target) as prometheus:
        exporter.set_series([Series("DCGM_FI_DEV_XID_ERRORS", "gpu-h100-0", 3, 79)])
        prometheus.wait_for("DCGM_FI_DEV_XID_ERRORS == 79")
        ... prometheus.url ...

Standard library only.
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

from _common import LabError, prometheus_path

FIELDS = {  # field -> (type, help), as in the DCGM exporter's counters file (roles/dcgm_exporter)
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Double-bit volatile ECC errors."),
    "DCGM_FI_DEV_RETIRED_PENDING": ("counter", "Total number of pages pending retirement."),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
}


@dataclasses.dataclass(frozen=True)
class Series:
    field: str
    node: str
    gpu: int
    value: float
    model: str = "NVIDIA H100 80GB HBM3"

    def line(self) -> str:
        labels = {"gpu": str(self.gpu), "UUID": f"GPU-{self.node}-{self.gpu}", "device": f"nvidia{self.gpu}",
                  "modelName": self.model, "Hostname": f"dcgm-exporter-{self.node}", "node": self.node}
        text = ",".join(f'{key}="{value}"' for key, value in labels.items())
        return f"{self.field}{{{text}}} {self.value:g}"


def exposition(series: Sequence[Series]) -> str:
    lines = []
    for field, (kind, help_text) in FIELDS.items():
        lines += [f"# HELP {field} {help_text}", f"# TYPE {field} {kind}"]
        lines += [item.line() for item in series if item.field == field]
    return "\n".join(lines) + "\n"


class ExporterDouble:
    """Serves the exposition of the series last set, on 127.0.0.1 (a free port)."""

    def __init__(self) -> None:
        self._text = exposition([])
        double = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = double._text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = "127.0.0.1:%d" % self._server.server_address[1]

    def set_series(self, series: Sequence[Series]) -> None:
        self._text = exposition(series)

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
