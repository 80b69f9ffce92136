#!/usr/bin/env python
"""Run one playbook of the project through ansible-runner and keep what it did: events, stats, rc, a summary.

The playbook is a collection playbook (``gpu_ops.cluster.validate``) or a path; the inventory one or more paths (or a
comma-separated host list, as ``-i`` takes). Each run gets an ident, a UTC timestamp plus a short random suffix
(``20261203T101530Z-3fa9c1``), and ansible-runner writes its artifacts under ``<artifacts>/<ident>/``: ``job_events/``
(one JSON file per event), ``stdout``, ``stderr``, ``status``, ``rc``, ``command``, ``fact_cache/``. This tool adds
``summary.json`` there (``schema: 1``: ident, playbook, inventory, status, rc, started, finished and the final stats
per host) and prints one line per play and task start and per host failure, then a short summary. The exit code is
the playbook's rc.

With ``--process-isolation-executable podman --container-image IMAGE`` the playbook runs inside the execution
environment (ansible-runner's container mode; ``ee/build.py`` builds ``localhost/gpu-ops-ee``). ansible-runner mounts
only its private data directory into the container (at ``/runner``) and, in container mode, always passes
``-i /runner/inventory``; so this tool mounts each inventory and playbook directory read-only at the same path, passes
them with ``-i`` itself, writes an empty ``/runner/inventory`` (no parse warning), and mounts the artifacts directory
over ``/runner/artifacts`` so that the container's event files land where the host's artifacts are.

Used as a library: ``run_playbook(RunRequest(...))`` returns a ``RunOutcome`` (rc, status, summary, artifact dir).
Everything else here is a pure function that the tests call directly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, TextIO, Tuple

SCHEMA = 1
SUMMARY_FILE = "summary.json"
# ns.collection.playbook, optionally with subdirectories (ns.collection.sub.playbook) as ansible-playbook resolves them.
COLLECTION_PLAYBOOK = re.compile(r"^[a-z0-9_]+\.[a-z0-9_]+(\.[A-Za-z0-9_-]+)+$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONTAINER_ENGINES = ("podman", "docker")
# Final stats keys of ansible-runner (ansible's names) -> the names in summary.json.
STATS_KEYS = (("ok", "ok"), ("changed", "changed"), ("failures", "failed"), ("dark", "unreachable"),
              ("skipped", "skipped"), ("rescued", "rescued"), ("ignored", "ignored"))
FAILURE_EVENTS = {"runner_on_failed": "FAILED", "runner_on_async_failed": "FAILED",
                  "runner_on_unreachable": "UNREACHABLE"}
MAX_MESSAGE = 240
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class UsageError(ValueError):
    """An argument this tool cannot use (bad JSON, missing playbook file, ...)."""


@dataclass(frozen=True)
class RunRequest:
    """Everything one run needs; paths may be relative to ``cwd`` (default: the current directory)."""

    playbook: str
    inventories: Tuple[str, ...]
    artifacts: str
    check: bool = False
    diff: bool = False
    limit: Optional[str] = None
    tags: Optional[str] = None
    skip_tags: Optional[str] = None
    extravars: Mapping[str, Any] = field(default_factory=dict)
    envvars: Mapping[str, str] = field(default_factory=dict)
    process_isolation_executable: Optional[str] = None
    container_image: Optional[str] = None
    container_volumes: Tuple[str, ...] = ()
    container_options: Tuple[str, ...] = ()
    project_dir: Optional[str] = None
    timeout: Optional[int] = None
    ident: Optional[str] = None
    cwd: Optional[str] = None


@dataclass
class RunOutcome:
    rc: int
    status: str
    ident: str
    artifact_dir: Path
    summary: Dict[str, Any]


# --- pure functions ------------------------------------------------------------------------------------------------

def utc_stamp(moment: datetime) -> str:
    """ISO 8601 in UTC with a Z, to the second: 2026-12-03T10:15:30Z."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_ident(moment: datetime, suffix: str) -> str:
    """Run ident: compact UTC timestamp plus a suffix; idents of one directory sort by start time."""
    if not re.fullmatch(r"[0-9a-z]{1,16}", suffix):
        raise ValueError(f"ident suffix {suffix!r}: 1 to 16 lower-case letters or digits")
    return moment.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + suffix


def new_ident(now: Optional[datetime] = None) -> str:
    return make_ident(now or datetime.now(timezone.utc), secrets.token_hex(3))


def is_container_mode(request: RunRequest) -> bool:
    return request.process_isolation_executable in CONTAINER_ENGINES


def resolve_playbook(playbook: str, cwd: Path) -> Tuple[str, str]:
    """("path", absolute path) for a playbook file, ("collection", name) for ns.collection.name.

    A file that exists wins over the collection reading (``a.b.yml`` in the current directory is a file)."""
    candidate = Path(playbook).expanduser()
    candidate = candidate if candidate.is_absolute() else cwd / candidate
    if candidate.is_file():
        return "path", str(candidate.resolve())
    if "/" not in playbook and COLLECTION_PLAYBOOK.match(playbook):
        return "collection", playbook
    raise UsageError(f"playbook {playbook!r}: no such file, and not a collection playbook name (ns.collection.name)")


def resolve_inventory(source: str, cwd: Path) -> str:
    """An inventory path made absolute; a host list (``localhost,`` or ``a,b``) passes as it is."""
    path = Path(source).expanduser()
    path = path if path.is_absolute() else cwd / path
    if path.exists():
        return str(path.resolve())
    if "," in source:
        return source
    raise UsageError(f"inventory {source!r}: no such file or directory (a host list needs a comma: 'host,')")


def _load_mapping_file(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except ValueError:
        import yaml  # PyYAML: a dependency of ansible-core and ansible-runner

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UsageError(f"{path}: neither JSON nor YAML ({exc})") from exc


def parse_mapping_arg(value: str, cwd: Path, what: str = "extravars") -> Dict[str, Any]:
    """A JSON object given inline, or ``@file`` holding a JSON or YAML mapping."""
    if value.startswith("@"):
        path = Path(value[1:]).expanduser()
        path = path if path.is_absolute() else cwd / path
        if not path.is_file():
            raise UsageError(f"{what} {value!r}: no such file")
        data = _load_mapping_file(path)
    else:
        try:
            data = json.loads(value)
        except ValueError as exc:
            raise UsageError(f"{what} {value!r}: not JSON ({exc}); use a JSON object or @file") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{what} {value!r}: must be a mapping, got {type(data).__name__}")
    return data


def parse_envvars(values: Iterable[str], cwd: Path) -> Dict[str, str]:
    """Merge ``--envvars`` values, in order: ``NAME=value``, a JSON object, or ``@file`` (JSON or YAML mapping)."""
    merged: Dict[str, str] = {}
    for value in values:
        if value.startswith("@") or value.lstrip().startswith("{"):
            pairs = parse_mapping_arg(value, cwd, "envvars")
        elif "=" in value:
            name, _, text = value.partition("=")
            pairs = {name: text}
        else:
            raise UsageError(f"envvars {value!r}: use NAME=value, a JSON object or @file")
        for name, text in pairs.items():
            if not ENV_NAME.match(str(name)):
                raise UsageError(f"envvars: {name!r} is not an environment variable name")
            if isinstance(text, (dict, list)):
                raise UsageError(f"envvars: {name} must be a scalar, got {type(text).__name__}")
            merged[str(name)] = "" if text is None else (json.dumps(text) if isinstance(text, bool) else str(text))
    return merged


def mount_dirs(paths: Iterable[str]) -> List[str]:
    """The directories to mount for these files or directories (a file brings its directory: group_vars and
    host_vars sit next to an inventory file); nested ones are covered by their parent."""
    dirs = sorted({str(Path(p) if Path(p).is_dir() else Path(p).parent) for p in paths if os.path.isabs(p)})
    kept: List[str] = []
    for directory in dirs:
        if not any(directory == k or directory.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(directory)
    return kept


def runner_kwargs(request: RunRequest, ident: str, private_data_dir: str, cwd: Path,
                  ansible_bin: Optional[str] = None) -> Dict[str, Any]:
    """The keyword arguments of ``ansible_runner.run`` for this request (no I/O besides path checks)."""
    kind, playbook = resolve_playbook(request.playbook, cwd)
    inventories = [resolve_inventory(i, cwd) for i in request.inventories]
    artifacts = str((cwd / Path(request.artifacts).expanduser()).resolve())
    cmdline: List[str] = []
    if request.check:
        cmdline.append("--check")
    if request.diff:
        cmdline.append("--diff")
    kwargs: Dict[str, Any] = {
        "private_data_dir": private_data_dir,
        "artifact_dir": artifacts,
        "ident": ident,
        "playbook": playbook,
        "quiet": True,
        "envvars": dict(request.envvars),
    }
    for key in ("limit", "tags", "skip_tags", "timeout"):
        if getattr(request, key) is not None:
            kwargs[key] = getattr(request, key)
    if request.extravars:
        kwargs["extravars"] = dict(request.extravars)
    if is_container_mode(request):
        if not request.container_image:
            raise UsageError("--process-isolation-executable podman needs --container-image")
        # ansible-runner passes -i /runner/inventory itself in container mode: the real sources go on the command line,
        # their directories mounted read-only at the same path.
        for source in inventories:
            cmdline.extend(["-i", source])
        mounted = [i for i in inventories if os.path.exists(i)] + ([playbook] if kind == "path" else [])
        volumes = [f"{d}:{d}:ro" for d in mount_dirs(mounted)]
        # The container writes each event's data to /runner/artifacts/<ident>/job_events; the host reads it from
        # <artifact_dir>/<ident>/job_events: the same directory only if the artifacts directory is mounted there.
        volumes.append(f"{artifacts}:/runner/artifacts:Z")
        kwargs.update({
            "process_isolation": True,
            "process_isolation_executable": request.process_isolation_executable,
            "container_image": request.container_image,
            "container_volume_mounts": volumes + list(request.container_volumes),
        })
        if request.container_options:
            kwargs["container_options"] = list(request.container_options)
    else:
        if request.process_isolation_executable:
            raise UsageError(f"--process-isolation-executable {request.process_isolation_executable!r}: "
                             f"only {' or '.join(CONTAINER_ENGINES)} (container mode) are supported")
        kwargs["inventory"] = inventories
        # The caller's ansible.cfg applies, as with ansible-playbook: ansible-runner runs in project_dir.
        kwargs["project_dir"] = str((cwd / (request.project_dir or ".")).resolve())
        if ansible_bin and "PATH" not in request.envvars:
            kwargs["envvars"]["PATH"] = ansible_bin + os.pathsep + os.environ.get("PATH", os.defpath)
    if cmdline:
        kwargs["cmdline"] = " ".join(_quote(a) for a in cmdline)
    return kwargs


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def _one_line(text: Any) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= MAX_MESSAGE else line[:MAX_MESSAGE - 3] + "..."


def failure_message(result: Mapping[str, Any]) -> str:
    """The shortest useful reason from a task result."""
    for key in ("msg", "stderr", "reason", "module_stderr", "stdout"):
        if result.get(key):
            return _one_line(result[key])
    return "(no message)"


def event_line(event: Mapping[str, Any]) -> Optional[str]:
    """The progress line for one ansible-runner event, or None for events not worth a line."""
    kind = event.get("event")
    data = event.get("event_data") or {}
    if kind == "playbook_on_play_start":
        name = data.get("name") or data.get("play") or ""
        pattern = data.get("pattern") or data.get("play_pattern") or ""
        return f"PLAY    {name} [{pattern}]" if pattern and pattern != name else f"PLAY    {name}"
    if kind in ("playbook_on_task_start", "playbook_on_handler_task_start"):
        label = "HANDLER" if kind == "playbook_on_handler_task_start" else "TASK   "
        return f"{label} {data.get('task') or data.get('name') or data.get('task_action') or ''}"
    if kind in FAILURE_EVENTS:
        if data.get("ignore_errors"):
            return None
        word = FAILURE_EVENTS[kind]
        return f"{word:<7} {data.get('host', '?')}: {data.get('task', '')}: {failure_message(data.get('res') or {})}"
    return None


def host_stats(stats: Optional[Mapping[str, Mapping[str, int]]]) -> Dict[str, Dict[str, int]]:
    """Per host counters from ansible-runner's final stats ({'ok': {host: n}, 'failures': {...}, ...})."""
    if not stats:
        return {}
    hosts = sorted({host for key, _ in STATS_KEYS for host in (stats.get(key) or {})}
                   | set(stats.get("processed") or {}))
    return {host: {name: int((stats.get(key) or {}).get(host, 0)) for key, name in STATS_KEYS} for host in hosts}


def summary_document(*, ident: str, playbook: str, inventories: Sequence[str], status: str, rc: int,
                     started: datetime, finished: datetime, stats: Dict[str, Dict[str, int]],
                     request: RunRequest, artifact_dir: str) -> Dict[str, Any]:
    """summary.json (schema 1). Later schemas add keys; a key's meaning never changes within one schema."""
    return {
        "schema": SCHEMA,
        "ident": ident,
        "playbook": playbook,
        "inventory": list(inventories),
        "status": status,
        "rc": rc,
        "started": utc_stamp(started),
        "finished": utc_stamp(finished),
        "duration_s": round((finished - started).total_seconds(), 3),
        "check": request.check,
        "diff": request.diff,
        "limit": request.limit,
        "tags": request.tags,
        "container_image": request.container_image if is_container_mode(request) else None,
        "artifact_dir": artifact_dir,
        "stats": stats,
    }


def stdout_tail(text: str, count: int = 6) -> List[str]:
    """Why a run stopped before its stats: from ansible's first error line on, else its last lines (non-empty lines
    without colour codes, at most ``count``)."""
    lines = [ANSI.sub("", line).rstrip() for line in text.splitlines()]
    lines = [line for line in lines if line.strip()]
    for index, line in enumerate(lines):
        if line.startswith(("[ERROR]", "ERROR!", "ERROR:")):
            return lines[index:index + count]
    return lines[-count:]


def format_summary(summary: Mapping[str, Any]) -> str:
    """The human summary printed at the end of a run."""
    lines = [f"{summary['status']} rc={summary['rc']} in {summary['duration_s']:.1f}s  "
             f"playbook {summary['playbook']}  ident {summary['ident']}"]
    columns = ["ok", "changed", "failed", "unreachable", "skipped"]
    stats = summary.get("stats") or {}
    if stats:
        width = max(len("host"), *(len(h) for h in stats))
        lines.append("  " + "host".ljust(width) + "".join(f"{c:>12}" for c in columns))
        for host, counts in stats.items():
            lines.append("  " + host.ljust(width) + "".join(f"{counts.get(c, 0):>12}" for c in columns))
    elif summary["rc"] == 0:
        lines.append("  no host matched the plays")
    else:
        lines.append("  no stats (the playbook did not run to its end: see stdout in the artifacts)")
    lines.append(f"artifacts: {summary['artifact_dir']}")
    return "\n".join(lines)


# --- the run ---------------------------------------------------------------------------------------------------------

def _ansible_bin() -> Optional[str]:
    """The directory of the ansible-playbook that belongs to this interpreter (a virtualenv's bin), if any."""
    candidate = Path(sys.executable).parent / "ansible-playbook"
    return str(candidate.parent) if candidate.exists() else None


def _event_printer(out: TextIO) -> Callable[[Mapping[str, Any]], bool]:
    def handle(event: Mapping[str, Any]) -> bool:
        line = event_line(event)
        if line:
            print(line, file=out, flush=True)
        return True  # keep every event in job_events

    return handle


def run_playbook(request: RunRequest, *, out: TextIO = sys.stdout) -> RunOutcome:
    """Run the playbook (blocking), write summary.json, print progress and the summary; return the outcome."""
    import ansible_runner

    cwd = Path(request.cwd or os.getcwd())
    ident = request.ident or new_ident()
    private_data_dir = tempfile.mkdtemp(prefix="gpu-ops-run-")
    try:
        kwargs = runner_kwargs(request, ident, private_data_dir, cwd,
                               None if is_container_mode(request) else _ansible_bin())
        if is_container_mode(request):
            inventory_dir = Path(private_data_dir) / "inventory"
            inventory_dir.mkdir(mode=0o700)
            (inventory_dir / "hosts.yml").write_text("all: {}\n", encoding="utf-8")
        os.makedirs(kwargs["artifact_dir"], exist_ok=True)
        started = datetime.now(timezone.utc)
        mode = f" in {request.container_image}" if is_container_mode(request) else ""
        print(f"run {ident}: {kwargs['playbook']}{mode}", file=out, flush=True)
        runner = ansible_runner.run(event_handler=_event_printer(out), **kwargs)
        finished = datetime.now(timezone.utc)
        rc = runner.rc if isinstance(runner.rc, int) else 1
        artifact_dir = Path(runner.config.artifact_dir)
        summary = summary_document(
            ident=ident, playbook=kwargs["playbook"],
            inventories=[resolve_inventory(i, cwd) for i in request.inventories],
            status=runner.status, rc=rc, started=started, finished=finished, stats=host_stats(runner.stats),
            request=request, artifact_dir=str(artifact_dir))
        (artifact_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n",
                                                 encoding="utf-8")
        if not summary["stats"] and rc != 0:
            stdout = artifact_dir / "stdout"
            for line in stdout_tail(stdout.read_text(encoding="utf-8", errors="replace") if stdout.exists() else ""):
                print(f"  | {line}", file=out)
        print(format_summary(summary), file=out, flush=True)
        return RunOutcome(rc=rc, status=runner.status, ident=ident, artifact_dir=artifact_dir, summary=summary)
    finally:
        shutil.rmtree(private_data_dir, ignore_errors=True)


# --- command line ----------------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu_ops_run",
        description="Run a playbook through ansible-runner; keep events, stats, rc and summary.json under "
                    "ARTIFACTS/<ident>/. The exit code is the playbook's rc.")
    parser.add_argument("playbook", help="collection playbook (gpu_ops.cluster.validate) or playbook path")
    parser.add_argument("-i", "--inventory", action="append", required=True, dest="inventories",
                        help="inventory path or host list; repeatable")
    parser.add_argument("--artifacts", required=True, metavar="DIR", help="directory for the run's artifacts")
    parser.add_argument("--check", action="store_true", help="ansible-playbook --check")
    parser.add_argument("--diff", action="store_true", help="ansible-playbook --diff")
    parser.add_argument("--limit", help="host pattern (ansible-playbook --limit)")
    parser.add_argument("--tags", help="comma-separated tags")
    parser.add_argument("--skip-tags", help="comma-separated tags to skip")
    parser.add_argument("--extravars", action="append", default=[], metavar="JSON|@FILE",
                        help="extra variables: a JSON object or @file (JSON or YAML); repeatable, later wins")
    parser.add_argument("--envvars", action="append", default=[], metavar="NAME=VALUE|JSON|@FILE",
                        help="environment of the run; repeatable")
    parser.add_argument("--process-isolation-executable", choices=CONTAINER_ENGINES,
                        help="run inside a container (the execution environment) with this engine")
    parser.add_argument("--container-image", help="execution environment image, e.g. localhost/gpu-ops-ee:latest")
    parser.add_argument("--container-volume", action="append", default=[], metavar="SRC:DST[:OPTS]",
                        help="extra volume for the container; repeatable")
    parser.add_argument("--container-option", action="append", default=[], metavar="OPT",
                        help="extra option for '<engine> run', e.g. --container-option=--network=host; repeatable")
    parser.add_argument("--project-dir", help="where the playbook runs outside a container (its ansible.cfg "
                                              "applies); default: the current directory")
    parser.add_argument("--timeout", type=int, help="seconds before the run is stopped (status timeout)")
    return parser


def request_from_args(args: argparse.Namespace, cwd: Path) -> RunRequest:
    extravars: Dict[str, Any] = {}
    for value in args.extravars:
        extravars.update(parse_mapping_arg(value, cwd))
    return RunRequest(
        playbook=args.playbook, inventories=tuple(args.inventories), artifacts=args.artifacts,
        check=args.check, diff=args.diff, limit=args.limit, tags=args.tags, skip_tags=args.skip_tags,
        extravars=extravars, envvars=parse_envvars(args.envvars, cwd),
        process_isolation_executable=args.process_isolation_executable, container_image=args.container_image,
        container_volumes=tuple(args.container_volume), container_options=tuple(args.container_option),
        project_dir=args.project_dir, timeout=args.timeout, cwd=str(cwd))


def main(argv: Optional[Sequence[str]] = None, out: TextIO = sys.stdout) -> int:
    from ansible_runner.exceptions import AnsibleRunnerException

    parser = build_parser()
    args = parser.parse_args(argv)
    cwd = Path.cwd()
    try:
        request = request_from_args(args, cwd)
        # Check the arguments before anything is created.
        runner_kwargs(request, "check", tempfile.gettempdir(), cwd)
        return run_playbook(request, out=out).rc
    except UsageError as exc:
        parser.error(str(exc))
    except AnsibleRunnerException as exc:  # ConfigurationError: an unsafe mount, a missing container image...
        parser.error(f"ansible-runner: {exc}")
    return 2  # not reached: parser.error exits


if __name__ == "__main__":
    sys.exit(main())
