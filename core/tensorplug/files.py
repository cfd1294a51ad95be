"""Files other processes may read while this one writes them: caches kept between runs.

A cache file (a GPU plugin's device list, the CPU kernels' runtime library) is read by
every process that starts, possibly while another rewrites it. :func:`replace_file`
writes the new contents beside the old file and renames it into place, so a reader
sees the old file or the new one, never half of either.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["replace_file"]


def replace_file(path: Path, data: bytes) -> None:
    """Make ``path`` hold ``data``, whole or not at all (its folder is made if needed).
    Raises ``OSError`` where it cannot be written; nothing is left behind then."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
