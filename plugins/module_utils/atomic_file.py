# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""One way the node modules write a file they own: never half of one (host_files, nvidia_containerd_runtime)."""

from __future__ import annotations

import os
import tempfile
from typing import Optional, Tuple


def write_atomically(path: str, body: bytes, mode: int, owner: Optional[Tuple[int, int]] = None) -> None:
    """Write body to path through a scratch file in the same directory, synced, then renamed over the old file, so an
    interrupted write leaves the old file or the new one. Missing parent directories are created with mode 0755;
    owner is (uid, gid), or the writer's own when None."""
    directory = os.path.dirname(path)
    missing = []
    while directory and not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for parent in reversed(missing):
        os.mkdir(parent, 0o755)
        os.chmod(parent, 0o755)
    handle, scratch = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=os.path.dirname(path))
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        if owner is not None:
            os.chown(scratch, *owner)
        os.chmod(scratch, mode)
        os.replace(scratch, path)
    except BaseException:
        if os.path.exists(scratch):
            os.unlink(scratch)
        raise
