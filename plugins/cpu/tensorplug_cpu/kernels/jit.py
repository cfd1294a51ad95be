"""Optional numba kernels for quantized weights: fused dequantize-and-dot, and decoding.

numpy cannot multiply quantized blocks by a vector without first writing the decoded
float32 matrix to memory, which makes matrix × vector (one token of a language model)
several times slower than reading the weights once. These kernels read each block,
decode it in registers and accumulate the dot product directly, with the output rows
split into chunks across threads. They are used only where numba is installed (and
imports, where it must: below); everything has a numpy fallback, and
``TENSORPLUG_CPU_JIT=0`` turns them off (:mod:`..settings`). Which kernel takes which
type is the table of :mod:`.dispatch`: this module binds what it chooses.

The kernels are held by reference (:mod:`.kernel_refs`), and run from their kept
machine code (:mod:`.kept_code`) where an earlier process kept it: where numba has run
in this cache folder before with these versions (:func:`.kernel_refs.kept_code_ready`), numba's
Python package is not imported at all until a kernel is not kept (its import is a
large share of a small model's launch to its first token); elsewhere (a first run) it
is imported at once, and a numba that fails to import leaves
the numpy kernels, saying why.

:class:`JitKernels` is the numba provider of :class:`.provider.CompiledKernels`, one
object made of its families (:mod:`.jit_products`, :mod:`.jit_attention`,
:mod:`.jit_rows`) over the calls they share (:mod:`.jit_calls`).

Decoding matches :mod:`tensorplug.quants` bit for bit (same float32 operations in the
same order, no fast-math), so the batched path gives the same weights either way; the
dot products use float32 with reassociation allowed, like ggml's SIMD reductions.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import sys
import threading
from typing import Any

from tensorplug import installed

from ..settings import JIT, MAX_NUMBA_THREADS, NUMBA_THREADS, THREADING_LAYER
from . import ahead, numba_internals
from .jit_attention import AttentionKernels
from .jit_binding import F16_TO_F32
from .jit_calls import KernelCalls, pool_kernels, release_llvm_pages
from .jit_products import MAX_SIBLINGS, ProductKernels
from .jit_rows import RowKernels
from .jit_steps import KernelCall, RowsCall
from .kernel_refs import kept_code_ready, resolve
from .numba_import import numba_module
from .threading_layer import Threads, preload_tbb, start_threads

__all__ = ["F16_TO_F32", "MAX_SIBLINGS", "JitKernels", "KernelCall", "RowsCall", "jit_status",
           "load_jit", "pool_kernels"]  # fmt: skip

_log = logging.getLogger("tensorplug_cpu")
_lock = threading.Lock()
_state: dict[str, Any] = {}


class JitKernels(ProductKernels, AttentionKernels, RowKernels, KernelCalls):
    """The numba kernels: every family's, over the calls they share (see the module);
    each kernel's first call loads its kept code, or has numba load or compile it (and
    keeps that code for later processes)."""

    #: the half-float → float32 table the decoders take (every 16-bit pattern's value)
    f16_to_f32 = F16_TO_F32

    def __init__(self, threads: Threads) -> None:
        """On the threading layer ``threads``, with a compile-ahead process where it is
        on (:mod:`.ahead`)."""
        compile_ahead = ahead.Ahead(resolve) if ahead.enabled() else None
        if compile_ahead is not None:
            atexit.register(compile_ahead.hand_over)
        super().__init__(threads, compile_ahead)
        self.version: str = _numba_version()

    @property
    def compiled(self) -> JitKernels:
        """Itself: every compiled path is numba's here (:class:`.provider.Kernels`)."""
        return self


def load_jit() -> JitKernels | None:
    """The numba kernels, or None when numba is missing, broken or disabled; cached."""
    with _lock:
        if "kernels" not in _state:
            _state["kernels"], _state["status"] = _try_load()
        return _state["kernels"]  # type: ignore[no-any-return]


def jit_status() -> str:
    """One line for ``get_features``: the numba version in use, or why there is none."""
    load_jit()
    return str(_state["status"])


def _numba_environment() -> str | None:
    """Checks numba's own settings before numba reads them (at its import): a value it
    cannot read raises SettingError; too many threads, which crash numba, are lowered
    in the environment. Returns why the kernels cannot be used, or None."""
    threads = NUMBA_THREADS.get()
    if sys.modules.get("numba") is not None:  # imported by someone else: read them already
        import numba

        n = int(getattr(numba.config, "NUMBA_NUM_THREADS", 1))
        if n > MAX_NUMBA_THREADS:
            _log.warning("numba was imported with NUMBA_NUM_THREADS=%d (more than %d, which "
                         "crashes it): using the numpy kernels", n, MAX_NUMBA_THREADS)  # fmt: skip
            return f"numba was imported with NUMBA_NUM_THREADS={n}, over {MAX_NUMBA_THREADS}"
    elif threads is not None and threads > MAX_NUMBA_THREADS:
        _log.warning("%s=%d is more threads than numba can start; using %d",
                     NUMBA_THREADS.env, threads, MAX_NUMBA_THREADS)  # fmt: skip
        os.environ[NUMBA_THREADS.env] = str(MAX_NUMBA_THREADS)
    return None


def _try_load() -> tuple[JitKernels | None, str]:
    if not JIT.get():  # a value it cannot read raises SettingError, naming the valid ones
        return None, f"disabled by {JIT.env}"
    why_not = _numba_environment()
    if why_not is not None:
        return None, why_not
    if importlib.util.find_spec("numba") is None:
        return None, "numba not installed (pip install -e 'plugins/cpu[numba]')"
    # the threads first (:mod:`.threading_layer`: without numba, as kept kernels need
    # them; numba, imported by a user before, starts its own): the layer a user set in
    # numba.config counts, and is checked here, not at the first parallel kernel, where
    # numba's ValueError surfaced
    numba_config = getattr(sys.modules.get("numba"), "config", None)
    layer = THREADING_LAYER.get(
        {THREADING_LAYER.env: str(getattr(numba_config, "THREADING_LAYER", "default"))}
        if numba_config is not None else None
    )  # fmt: skip
    preload_tbb(layer)
    try:
        threads = start_threads(layer)
    except ValueError as e:  # no layer loads (TBB asked for and missing, ...)
        _log.warning("numba's threading layer failed to start, using numpy kernels: %s", e)
        return None, f"numba's threading layer failed to start: {e}"
    if not kept_code_ready():
        try:  # numba now: what a launch needs is not all kept (a first run, ...)
            numba_module()
            from . import _numba_quant  # noqa: F401  (compiles nothing yet; checks numba works)
        except ImportError:
            return None, "numba not installed (pip install -e 'plugins/cpu[numba]')"
        except Exception as e:  # a numba build that does not match this numpy, etc.
            _log.warning("numba failed to import, using numpy kernels: %s", e)
            return None, f"numba failed to import: {type(e).__name__}: {e}"
    kernels = JitKernels(threads)
    release_llvm_pages()  # llvmlite's (and numba's) import: static initializers all over LLVM
    why_public = numba_internals.why_off()
    launch = "fast launch" if why_public is None else f"numba's public API only ({why_public})"
    return kernels, f"numba {kernels.version}, {threads.layer} threading layer, {launch}"


def _numba_version() -> str:
    """numba's version as installed (read without importing it), else as imported (a
    source tree)."""
    return installed.version("numba") or str(getattr(numba_module(), "__version__", "unknown"))
