"""Cases that need numba's disk cache fresh: a module of kernels in a folder of its own,
run by scripts in new processes whose cache is that folder's (a kernel loads, or
compiles, once a process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path


def kernel_folder(folder: Path, source: str) -> Path:
    """``folder`` holding ``user_kernels.py`` of ``source`` (dedented)."""
    (folder / "user_kernels.py").write_text(textwrap.dedent(source))
    return folder


def run_script(folder: Path, script: str, *args: str) -> dict:
    """``script`` (which imports ``user_kernels``) in a new process, numba's cache in
    ``folder/cache``; the JSON object its last line prints."""
    path = os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "NUMBA_CACHE_DIR": str(folder / "cache"), "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=env,
        timeout=300, cwd=folder,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return result
