"""Shared helpers for lab/labctl.py: logging, subprocesses, caches, hashing, files.

Standard library only, so the lab tooling runs with plain ``python3`` on a
fresh Debian 12 host before any virtual environment exists.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

CACHE_ENV = "GPU_LAB_CACHE"
DEFAULT_CACHE_ROOT = Path("/var/cache/gpu-lab")
MIRROR_ENV = "GPU_LAB_DEBIAN_MIRROR"
DEFAULT_DEBIAN_MIRROR = "http://deb.debian.org/debian"

_print_lock = threading.Lock()


class LabError(Exception):
    """A failure the user can act on; printed without a traceback."""


def log(message: str, prefix: str = "") -> None:
    """Print one progress line at once (long steps must show they are alive)."""
    tag = f"[{prefix}] " if prefix else ""
    with _print_lock:
        print(f"labctl: {tag}{message}", flush=True)


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """Root of every lab cache: $GPU_LAB_CACHE or /var/cache/gpu-lab."""
    env = os.environ if environ is None else environ
    value = env.get(CACHE_ENV, "").strip()
    return Path(value) if value else DEFAULT_CACHE_ROOT


def promtool_path(environ: Mapping[str, str] | None = None) -> Path:
    """promtool as `labctl promtool` unpacks it ($GPU_LAB_CACHE/bin/promtool), or $PROMTOOL."""
    env = os.environ if environ is None else environ
    value = env.get("PROMTOOL", "").strip()
    return Path(value) if value else cache_root(env) / "bin" / "promtool"


def cdi_validate_path(environ: Mapping[str, str] | None = None) -> Path:
    """The CDI oracle as `labctl cdi-validate` builds it ($GPU_LAB_CACHE/bin/cdi-validate), or $CDI_VALIDATE."""
    env = os.environ if environ is None else environ
    value = env.get("CDI_VALIDATE", "").strip()
    return Path(value) if value else cache_root(env) / "bin" / "cdi-validate"
def device_plugin_config_check_path(environ: Mapping[str, str] | None = None) -> Path:
    """The device plugin config oracle as `labctl device-plugin-config` links it
    ($GPU_LAB_CACHE/bin/device-plugin-config-check), or $DEVICE_PLUGIN_CONFIG_CHECK."""
    env = os.environ if environ is None else environ
    value = env.get("DEVICE_PLUGIN_CONFIG_CHECK", "").strip()
    return Path(value) if value else cache_root(env) / "bin" / "device-plugin-config-check"
def nvml_mig_mocks_path(environ: Mapping[str, str] | None = None) -> Path:
    """The go-nvml MIG mocks dumper as `labctl nvml-mig-mocks` links it ($GPU_LAB_CACHE/bin/nvml-mig-mocks), or
    $NVML_MIG_MOCKS."""
    env = os.environ if environ is None else environ
    value = env.get("NVML_MIG_MOCKS", "").strip()
    return Path(value) if value else cache_root(env) / "bin" / "nvml-mig-mocks"
def kueue_validate_path(environ: Mapping[str, str] | None = None) -> Path:
    """Kueue's ClusterQueue validation as `labctl kueue-validate` links it ($GPU_LAB_CACHE/bin/kueue-validate), or
    $KUEUE_VALIDATE."""
    env = os.environ if environ is None else environ
    value = env.get("KUEUE_VALIDATE", "").strip()
    return Path(value) if value else cache_root(env) / "bin" / "kueue-validate"


def prometheus_path(environ: Mapping[str, str] | None = None) -> Path:
    """prometheus as `labctl promtool` unpacks it beside promtool ($GPU_LAB_CACHE/bin/prometheus), or $PROMETHEUS."""
    env = os.environ if environ is None else environ
    value = env.get("PROMETHEUS", "").strip()
    return Path(value) if value else cache_root(env) / "bin" / "prometheus"


def debian_mirror(environ: Mapping[str, str] | None = None) -> str:
    """Debian mirror URL: $GPU_LAB_DEBIAN_MIRROR or deb.debian.org, without trailing slash."""
    env = os.environ if environ is None else environ
    value = env.get(MIRROR_ENV, "").strip() or DEFAULT_DEBIAN_MIRROR
    return value.rstrip("/")


def format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:04.1f}s"


def format_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{size} B"  # unreachable, keeps type checkers calm


def require_tools(tools: Mapping[str, str]) -> None:
    """Fail naming every missing executable and the Debian package that ships it."""
    missing = [f"{tool} (package {package})" for tool, package in tools.items() if shutil.which(tool) is None]
    if missing:
        raise LabError("missing tool(s): " + ", ".join(missing) + "; run `python3 lab/labctl.py prereqs` first")


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("this command must run as root (it installs packages, builds rootfs trees and runs podman)")


def _command_text(cmd: Sequence[str]) -> str:
    return shlex.join(str(part) for part in cmd)


def run(
    cmd: Sequence[str],
    *,
    capture: bool = True,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    input_text: str | None = None,
    stdout_path: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise LabError naming the command and its error output."""
    full_env = None if env is None else {**os.environ, **env}
    try:
        if stdout_path is not None:
            with open(stdout_path, "w", encoding="utf-8") as out:
                result = subprocess.run(
                    [str(part) for part in cmd], stdout=out, stderr=subprocess.PIPE, text=True,
                    env=full_env, cwd=cwd, input=input_text, check=False,
                )
        else:
            result = subprocess.run(
                [str(part) for part in cmd], capture_output=capture, text=True,
                env=full_env, cwd=cwd, input=input_text, check=False,
            )
    except FileNotFoundError as exc:
        raise LabError(f"cannot run `{_command_text(cmd)}`: {cmd[0]} not found") from exc
    if check and result.returncode != 0:
        raise LabError(
            f"command failed (exit {result.returncode}): {_command_text(cmd)}\n"
            + tail(result.stderr or result.stdout or "")
        )
    return result


def stream(
    cmd: Sequence[str],
    on_line: Callable[[str], None],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> None:
    """Run a long command, copying its output to log_path and each line to on_line."""
    full_env = None if env is None else {**os.environ, **env}
    with open(log_path, "w", encoding="utf-8") as log_file:
        try:
            proc = subprocess.Popen(
                [str(part) for part in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, errors="replace", env=full_env, cwd=cwd, bufsize=1,
            )
        except FileNotFoundError as exc:
            raise LabError(f"cannot run `{_command_text(cmd)}`: {cmd[0]} not found") from exc
        assert proc.stdout is not None
        for line in proc.stdout:
            log_file.write(line)
            on_line(line.rstrip("\n"))
        code = proc.wait()
    if code != 0:
        raise LabError(
            f"command failed (exit {code}): {_command_text(cmd)}\nfull log: {log_path}\n"
            + tail(log_path.read_text(encoding="utf-8", errors="replace"))
        )


def tail(text: str, lines: int = 25) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_if_changed(path: Path, content: str | bytes, mode: int = 0o644) -> bool:
    """Atomically write path unless it already holds content; True when it changed."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    if path.is_file() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return True


@contextlib.contextmanager
def file_lock(path: Path, what: str) -> Iterator[None]:
    """Serialise two labctl runs that would build the same thing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another labctl run that holds {path} ({what})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def mounts_under(root: Path, mountinfo: str | None = None) -> list[str]:
    """Mount points at or below root, deepest first (so they unmount in order)."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text(encoding="utf-8")
    base = os.path.realpath(root) if root.exists() else str(root)
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        if point == base or point.startswith(base.rstrip("/") + "/"):
            found.append(point)
    return sorted(found, key=len, reverse=True)


def remove_tree(root: Path) -> None:
    """Delete a build tree safely: unmount what a failed debootstrap left, never cross filesystems."""
    if not root.exists():
        return
    for point in mounts_under(root):
        run(["umount", "-l", point])
    if mounts_under(root):
        raise LabError(f"refusing to delete {root}: something is still mounted below it")
    run(["rm", "-rf", "--one-file-system", str(root)])


class Heartbeat:
    """Print a 'still working' line every `every` seconds while a long step runs."""

    def __init__(self, message: Callable[[], str], prefix: str = "", every: float = 20.0) -> None:
        self._message = message
        self._prefix = prefix
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            log(self._message(), self._prefix)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Stopwatch:
    def __init__(self) -> None:
        self.start = time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start


def eprint(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
