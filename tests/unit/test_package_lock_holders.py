"""The package-lock module names the process holding apt's or dpkg's lock, read from /proc/locks the way the kernel
writes it: against a real lock this test process takes on a scratch file, and against recorded /proc/locks lines."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import time
from pathlib import Path

from conftest import load_ansible_module

holders_module = load_ansible_module("package_lock_holders")

RECORDED = """\
1: POSIX  ADVISORY  WRITE 17381 fd:01:1835020 0 EOF
2: OFDLCK ADVISORY  WRITE -1 fd:01:1835021 0 EOF
3: FLOCK  ADVISORY  WRITE 1200 00:1a:77 0 EOF
3: -> FLOCK  ADVISORY  WRITE 1300 00:1a:77 0 EOF
garbage line
"""


def test_proc_locks_lines_are_read_and_waiters_skipped():
    assert holders_module.parse_locks(RECORDED) == [
        ("POSIX", 17381, 0xfd, 0x01, 1835020), ("OFDLCK", -1, 0xfd, 0x01, 1835021), ("FLOCK", 1200, 0, 0x1a, 77)]


def _hold(path: str, ready, release) -> None:
    with open(path, "w") as handle:
        fcntl.lockf(handle, fcntl.LOCK_EX)  # a POSIX record lock, as apt and dpkg take
        ready.set()
        release.wait(30)


def test_the_holder_of_a_real_lock_is_named_with_its_command_line(tmp_path: Path):
    lock = tmp_path / "lock-frontend"
    lock.touch()
    other = tmp_path / "lock"
    other.touch()
    ready, release = multiprocessing.Event(), multiprocessing.Event()
    holder = multiprocessing.Process(target=_hold, args=(str(lock), ready, release))
    holder.start()
    try:
        assert ready.wait(10)
        text = Path("/proc/locks").read_text()
        found = holders_module.lock_holders([str(lock), str(other), str(tmp_path / "missing")], text)
        assert [(h["path"], h["pid"], h["kind"]) for h in found] == [(str(lock), holder.pid, "POSIX")]
        assert found[0]["command"] and "\n" not in found[0]["command"]
        assert found[0]["summary"] == f"{lock} is held by process {holder.pid} ({found[0]['command']})"
    finally:
        release.set()
        holder.join(10)
    time.sleep(0.1)
    assert holders_module.lock_holders([str(lock)], Path("/proc/locks").read_text()) == []


def test_a_lock_without_a_pid_is_put_on_the_processes_that_have_the_file_open(tmp_path: Path):
    lock = tmp_path / "lock"
    lock.touch()
    info = os.stat(lock)
    text = f"1: OFDLCK ADVISORY  WRITE -1 {os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino} 0 EOF\n"
    with open(lock) as handle:  # this process has it open
        assert handle
        found = holders_module.lock_holders([str(lock)], text)
    assert [(h["pid"], h["kind"]) for h in found] == [(os.getpid(), "OFDLCK")]
    assert holders_module.lock_holders([str(lock)], text)[0]["pid"] == -1


def test_long_command_lines_are_cut(tmp_path: Path):
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cmdline").write_bytes(b"python3\0-c\0" + b"x" * 500 + b"\0")
    command = holders_module.command_of(42, str(proc))
    assert len(command) == holders_module.COMMAND_LIMIT and command.startswith("python3 -c xxx") and command.endswith("...")
    (proc / "43").mkdir()
    (proc / "43" / "cmdline").write_bytes(b"")
    (proc / "43" / "comm").write_bytes(b"kworker\n")
    assert holders_module.command_of(43, str(proc)) == "[kworker]"
    assert holders_module.command_of(44, str(proc)).startswith("unknown")
