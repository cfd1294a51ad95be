"""``import tensorplug`` must stay cheap: no plugin, no GPU library, no discovery."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("tensorplug_", "cupy", "pyopencl", "Metal", "objc", "gguf", "numba", "torch")


def test_import_loads_no_plugin_or_gpu_library() -> None:
    code = (
        "import sys, tensorplug\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True, text=True, check=True,
    )
    loaded = out.stdout.split()
    offenders = [m for m in loaded if m.startswith(HEAVY)]
    assert offenders == []
    # -X importtime lists every module imported; the same check on its own report
    assert not any(f"| {h}" in line for line in out.stderr.splitlines() for h in HEAVY)
