"""Kernels' machine code kept by tensorplug and loaded without numba's cache
(tensorplug_cpu.kernels.numba_internals.kept_code): the key tells numba's types apart as numba does,
an entry is what was written or nothing, and a kernel or job kept by one process runs
in the next without numba loading it. The end-to-end cases run in fresh processes with
their own cache folder: a kernel loads once a process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from cached_kernels import kernel_folder, run_script

pytest.importorskip("numba")

import numba

from tensorplug_cpu.kernels.arg_types import arg_key
from tensorplug_cpu.kernels.numba_internals.kept_code import (
    CALLABLE,
    JOB,
    Entry,
    KeptCode,
    entry_file,
)

#: the symbol tables read are ELF's; elsewhere numba loads every kernel itself
ELF_ONLY = pytest.mark.skipif(
    sys.platform != "linux", reason="kept code is loaded from ELF objects (Linux)"
)


def _unaligned() -> np.ndarray:
    raw = np.zeros(4 * 8 + 1, np.uint8)
    return raw[1:].view(np.float32)  # a float32 view at an odd address


def _readonly() -> np.ndarray:
    a = np.zeros((2, 3), np.float32)
    a.flags.writeable = False
    return a


#: arguments numba types differently from one another in some way, and some alike
_VALUES = [
    np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32),  # same type
    np.zeros((2, 3), np.float32).T, np.zeros((4, 6), np.float32)[::2, ::2],
    np.zeros((2, 3), np.float64), np.zeros((2, 3, 1), np.float32), np.zeros(0, np.int8),
    np.zeros(3, np.int8), np.zeros(3, np.uint8), np.zeros(3, np.bool_), np.zeros(3, np.int64),
    np.zeros(3, np.complex64), _unaligned(), _readonly(),
    0, 7, -(1 << 63), 1 << 63, 1.5, True, False,
    np.float32(1), np.float64(1), np.int64(1), np.int32(1), np.uint16(1), np.bool_(True),
    np.uint64(1), 2j, np.complex64(1),
    (np.zeros(2, np.float32), np.zeros(2, np.float32)),
    (np.zeros(2, np.float32), np.zeros(2, np.int8)), (1, 2.0), (1, 2), (),
]  # fmt: skip


def test_the_key_tells_apart_what_numba_types_apart() -> None:
    """Two arguments have the same key exactly where numba's ``typeof`` gives them the
    same type: a kept kernel is never called with arguments of another type."""
    keys = [arg_key([v]) for v in _VALUES]
    assert all(k is not None for k in keys)
    kinds = [numba.typeof(v) for v in _VALUES]
    for i in range(len(_VALUES)):
        for j in range(len(_VALUES)):
            assert (keys[i] == keys[j]) == (kinds[i] == kinds[j]), (_VALUES[i], _VALUES[j])


@pytest.mark.parametrize("value", [
    "text", [1, 2], None, 1 << 64, np.zeros(2, [("a", np.int8)]), np.zeros(2, "U3"),
    np.zeros(2, object), (np.zeros(2), "x"), np.zeros(2, ">f4"),
    np.ma.zeros(2), np.zeros(2).view(np.matrix),
])  # fmt: skip
def test_arguments_numba_types_its_own_way_have_no_key(value: object) -> None:
    """Anything else (numba's records, strings, lists, objects, arrays of the other byte
    order or of a subclass) is numba's to type, or to refuse."""
    assert arg_key([np.zeros(1), value]) is None


def test_an_entry_reads_back_whole_or_not_at_all(tmp_path: Path) -> None:
    entry = Entry(CALLABLE, "_ZN7cpython4user", "user_kernels", "plus_one", b"\x7fELF..code")
    data = entry.to_bytes()
    assert Entry.from_bytes(data) == entry
    for cut in (0, 10, 40, len(data) - 1):
        assert Entry.from_bytes(data[:cut]) is None
    flipped = bytearray(data)
    flipped[-1] ^= 1
    assert Entry.from_bytes(bytes(flipped)) is None
    # a whole file of another kind of entry is refused as well
    other = Entry("python", "s", "m", "n", b"code").to_bytes()
    assert Entry.from_bytes(other) is None
    # where an entry lives depends on the kernel, its types and the salt
    a = entry_file(tmp_path, "kernel", ("int64",), "salt")
    assert a.parent == tmp_path
    assert len({a, entry_file(tmp_path, "other", ("int64",), "salt"),
                entry_file(tmp_path, "kernel", ("float",), "salt"),
                entry_file(tmp_path, "kernel", ("int64",), "other salt")}) == 4  # fmt: skip
    assert JOB != CALLABLE


def test_code_this_loader_cannot_read_is_not_kept(tmp_path: Path) -> None:
    """Machine code that is not ELF (another platform's objects) is not written: no
    later process could load it."""
    kept = KeptCode(tmp_path, "salt", lambda: None)
    kept.keep("kernel", ("int64",), Entry(CALLABLE, "f", "m", "f", b"\xcf\xfa\xed\xfe mach-o"))
    assert list(tmp_path.iterdir()) == []
    assert kept.load("kernel", ("int64",)) is None


_KERNELS = """
import numpy as np
from numba import carray
from tensorplug_cpu.kernels._numba_cache import kernel
from tensorplug_cpu.kernels.job_function import job_function
from tensorplug_cpu.kernels._numba_pool import address

@kernel()
def scaled_sum(x, scale):
    acc = 0.0
    for i in range(x.shape[0]):
        acc += x[i] * scale
    return acc

@kernel()
def squares_into(out):
    tmp = np.empty(out.shape[0], np.float64)  # numba's runtime allocates and frees it
    for i in range(out.shape[0]):
        tmp[i] = i * i
    out[:] = tmp

def _fill(job, lo, hi):
    if lo < 0:
        return
    block = carray(address(job), 4, np.int64)
    for i in range(lo, hi):
        block[i] = 10 * i + block[3]

fill = job_function(_fill, "user_fill_job")
"""

#: runs both kernels and the job, and says who loaded what: "keep" keeps them (numba
#: loads or compiles), "load" loads the kept ones first
_RUN = """
import ctypes, json, sys
import numpy as np
import user_kernels as u
from tensorplug_cpu.kernels.numba_internals.kept_kernels import (
    compile_job, job_ready, keep_overload, load_kept,
)

x = np.arange(5, dtype=np.float32)
out = np.zeros(6, np.float64)
kept = {}
if sys.argv[1] == "load":
    kept["scaled_sum"] = load_kept(u.scaled_sum, (x, 2.0))
    kept["squares_into"] = load_kept(u.squares_into, (out,))
    kept["scaled_sum again"] = load_kept(u.scaled_sum, (x, 2.0))  # given already
    kept["scaled_sum of int8"] = load_kept(u.scaled_sum, (x.astype(np.int8), 2.0))
    kept["fill"] = job_ready(u.fill)
total = u.scaled_sum(x, 2.0)
u.squares_into(out)
if sys.argv[1] == "keep":
    keep_overload(u.scaled_sum, (x, 2.0))
    keep_overload(u.squares_into, (out,))
    compile_job(u.fill)
    kept["again"] = load_kept(u.scaled_sum, (x, 2.0))  # numba has it here: not loaded twice
block = np.array([0, 0, 0, 5], np.int64)
ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(u.fill.address)(
    block.ctypes.data, 0, 3)
numba_loads = {k: sum(getattr(u, k).stats.cache_hits.values()) + len(getattr(u, k).overloads)
               for k in ("scaled_sum", "squares_into")}
print(json.dumps({"total": total, "out": out.tolist(), "block": block.tolist(),
                  "kept": kept, "numba": numba_loads, "job_hits": u.fill.numba_function._cache_hits,
                  "modules": sorted(m for m in sys.modules if m.startswith("user"))}))
"""


def _results(run: dict) -> tuple[object, ...]:
    """What a script computed: the sum, the squares, the job's block."""
    return run["total"], run["out"], run["block"]


@ELF_ONLY
def test_a_kept_kernel_runs_in_the_next_process_without_numba_loading_it(
    tmp_path: Path,
) -> None:
    """Kept by one process, a kernel (one that allocates through numba's runtime too)
    and a job run in the next from the kept code, with the same results, numba's
    dispatcher holding no overload it loaded; arguments of another type are numba's."""
    folder = kernel_folder(tmp_path, _KERNELS)
    first = run_script(folder, _RUN, "keep")
    assert first["total"] == pytest.approx(20.0)
    assert first["out"] == [float(i * i) for i in range(6)]
    assert first["block"] == [5, 15, 25, 5]
    kept_files = sorted((folder / "cache").rglob("kept-*.tpk"))
    assert len(kept_files) == 3
    assert first["kept"] == {"again": False}

    second = run_script(folder, _RUN, "load")
    assert second["kept"] == {"scaled_sum": True, "squares_into": True, "scaled_sum again": True,
                              "scaled_sum of int8": False, "fill": True}  # fmt: skip
    assert _results(second) == _results(first)
    assert second["numba"] == {"scaled_sum": 0, "squares_into": 0}
    assert second["job_hits"] == 0


@ELF_ONLY
def test_a_damaged_kept_file_is_left_to_numba(tmp_path: Path) -> None:
    """A kept file that is not what was written loads nothing: numba loads the kernel
    from its own cache, and the results are the same."""
    folder = kernel_folder(tmp_path, _KERNELS)
    first = run_script(folder, _RUN, "keep")
    for path in (folder / "cache").rglob("kept-*.tpk"):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    second = run_script(folder, _RUN, "load")
    assert second["kept"] == {"scaled_sum": False, "squares_into": False,
                              "scaled_sum again": False, "scaled_sum of int8": False,
                              "fill": True}  # fmt: skip
    assert _results(second) == _results(first)
    assert second["numba"] == {"scaled_sum": 2, "squares_into": 2}
    assert second["job_hits"] == 1


#: in a process that never imports numba: the kernels and the job found as a launch
#: finds them (their folder, identity and argument types, all computed without numba),
#: loaded, and run
_WITHOUT_NUMBA = """
import ctypes, json, sys
from pathlib import Path
import numpy as np
from tensorplug_cpu.kernels.arg_types import arg_key
from tensorplug_cpu.kernels.kernel_identity import identity
from tensorplug_cpu.kernels.numba_internals.kept_kernels import kept_in

kept = kept_in()
x = np.arange(5, dtype=np.float32)
out = np.zeros(6, np.float64)
scaled_sum = kept.load(identity(("module", "user_kernels", "scaled_sum")), arg_key((x, 2.0)))
squares_into = kept.load(identity(("module", "user_kernels", "squares_into")), arg_key((out,)))
fill = kept.load(identity(("job", "user_kernels", "user_fill_job")), ("job",))
total = scaled_sum(x, 2.0)
squares_into(out)
block = np.array([0, 0, 0, 5], np.int64)
ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(fill)(
    block.ctypes.data, 0, 3)
print(json.dumps({"total": total, "out": out.tolist(), "block": block.tolist(),
                  "folder": str(kept.folder),
                  "numba": sorted(m for m in sys.modules if m.split(".")[0] == "numba")}))
"""

_CACHE_FOLDER = """
import json
import user_kernels as u
print(json.dumps({"folder": u.scaled_sum.stats.cache_path}))
"""


@ELF_ONLY
def test_kept_code_runs_in_a_process_that_never_imports_numba(tmp_path: Path) -> None:
    """What a launch without numba's Python package will rest on: the kept kernels and
    job, found (numba's cache folder, their identities) and loaded with llvmlite and
    numba's C runtime alone, give the results numba's compiled code gave, and the
    process has none of numba's Python modules."""
    folder = kernel_folder(tmp_path, _KERNELS)
    first = run_script(folder, _RUN, "keep")
    alone = run_script(folder, _WITHOUT_NUMBA)
    assert _results(alone) == _results(first)
    numba_folder = Path(run_script(folder, _CACHE_FOLDER)["folder"])
    assert Path(alone["folder"]).parent == numba_folder.parent  # the same kernel cache
    assert alone["numba"] == [
        "numba._dynfunc", "numba._helperlib", "numba.core.runtime._nrt_python",
    ]  # fmt: skip


#: a model's launch, its prompt and a few tokens: what it computed, and whether numba's
#: Python package was imported
_LAUNCH = """
import json, sys
from tensorplug_llm.runner import ModelRunner

with ModelRunner(sys.argv[1], n_ctx=64, n_batch=32, n_threads=int(sys.argv[2])) as m:
    logits = m.eval(list(range(1, 12)))
    tokens = [int(logits.argmax())]
    for _ in range(3):
        tokens.append(int(m.eval([tokens[-1]]).argmax()))
print(json.dumps({"logits": logits[:32].tolist(), "tokens": tokens,
                  "numba": "numba" in sys.modules}))
"""


@ELF_ONLY
@pytest.mark.parametrize("threads", [1, 2])
def test_a_launch_whose_kernels_are_kept_never_imports_numba(tmp_path: Path, threads: int) -> None:
    """A model run once keeps every kernel and job its launch, prompt and tokens need;
    the next process runs them all from kept code, numba's Python package never
    imported, with the logits and tokens numba's kernels gave (and those of a process
    where kept code is off). No compile-ahead process: the first run compiles or loads
    everything itself, so that one run keeps all (with it, kernels the child made are
    kept at the run after)."""
    import os
    import subprocess

    from tensorplug_llm.tiny import write_tiny_llama

    model = write_tiny_llama(tmp_path / "m.gguf", "q4_0")
    base = {**os.environ, "TENSORPLUG_CPU_COMPILE_AHEAD": "0"}

    def launch(**env: str) -> dict:
        done = subprocess.run([sys.executable, "-c", _LAUNCH, str(model), str(threads)],
                              capture_output=True, text=True, timeout=600,
                              env={**base, **env})  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        result: dict = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    numba_only = launch(TENSORPLUG_CPU_NUMBA_INTERNALS="0")
    first, second = launch(), launch()
    assert numba_only["numba"] and not second["numba"]
    for run in (first, second):
        assert run["tokens"] == numba_only["tokens"]
        assert run["logits"] == numba_only["logits"]
