"""What kept machine code is filed under, computed without numba
(:mod:`tensorplug_cpu.kernels.kernel_identity`), checked against what numba itself
computes: its code generator's target, the kernels' origins."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("numba")

from tensorplug_cpu.kernels import kernel_identity as ki
from tensorplug_cpu.system import AVX2_FEATURES

#: numba's own view of its target, and the module's, in a new process (the environment
#: is read once, at numba's import)
_TARGETS = """
import json
from numba.core.registry import cpu_target
from tensorplug_cpu.kernels.kernel_identity import compile_target
print(json.dumps({"numba": list(cpu_target.target_context.codegen().magic_tuple()),
                  "ours": list(compile_target()[:3])}))
"""


@pytest.mark.parametrize("env", [
    {}, {"NUMBA_CPU_NAME": "generic"}, {"NUMBA_CPU_FEATURES": AVX2_FEATURES},
    {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+avx2,+fma"},
], ids=["host", "generic", "avx2 features", "haswell"])  # fmt: skip
def test_the_target_is_what_numba_compiles_for(env: dict[str, str]) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    done = subprocess.run([sys.executable, "-c", _TARGETS], capture_output=True, text=True,
                          env={**clean, **env}, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["ours"] == seen["numba"]


def test_the_identity_changes_with_what_the_code_depends_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    origin = ("module", "tensorplug_cpu.kernels._numba_rows", "rms_norm_rows")
    base = ki.identity(origin)
    assert base is not None and base == ki.identity(origin)
    assert ki.identity(("module", "tensorplug_cpu.kernels._numba_rows", "rope_rows")) != base
    packed = ("made", "tensorplug_cpu.kernels._numba_repack", "packed_driver", (2,))
    assert ki.identity((*packed, False, "serial")) != ki.identity((*packed, True, "serial"))
    monkeypatch.setenv("NUMBA_OPT", "0")
    assert ki.identity(origin) != base
    monkeypatch.delenv("NUMBA_OPT")
    monkeypatch.setattr(ki, "instruction_forms", lambda: (False,) * len(ki.FORM_FLAGS))
    assert ki.identity(origin) != base
    assert ki.identity(("module", "no_such_module_here", "f")) is None


def test_the_forms_without_numba_are_the_ones_its_import_sets() -> None:
    from tensorplug_cpu.kernels import _numba_ir

    imported = ki.instruction_forms()
    assert imported == tuple(getattr(_numba_ir, n) for n in ki.FORM_FLAGS)
    code = (
        "import json\nfrom tensorplug_cpu.kernels.kernel_identity import instruction_forms\n"
        "print(json.dumps([instruction_forms(), 'numba' in __import__('sys').modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    forms, numba_imported = json.loads(done.stdout)
    assert tuple(forms) == imported and not numba_imported


def test_origins_of_kernels_and_jobs() -> None:
    from tensorplug_cpu.kernels import _numba_jobs, _numba_rows

    assert ki.origin_of(_numba_rows.rms_norm_rows) == (
        "module",
        "tensorplug_cpu.kernels._numba_rows",
        "rms_norm_rows",
    )
    assert ki.origin_of(_numba_jobs.jobs()["rms_norm"]) == (
        "made_job",
        "tensorplug_cpu.kernels._numba_jobs",
        "step_job",
        "rms_norm",
    )
    assert ki.origin_of(len) is None
