"""llama.cpp's intermediate tensors for a prompt, by name, into an ``.npz`` file.

    ~/peers/bin/python benchmarks/dump_llamacpp_tensors.py MODEL.gguf OUT.npz
        [--prompt TEXT] [--names REGEX] [--token-by-token]

Runs in an interpreter with llama-cpp-python (not tensorplug's). Through the context's
``cb_eval`` hook, each float32 graph node whose name matches ``--names`` (default: every
node of layers 0 and 1 and the logits, e.g. ``attn_norm-0``, ``Qcur-0``, ``kq-0``,
``kq_soft_max-0``, ``kqv_out-0``, ``ffn_out-0``, ``result_output``) is copied out after
ggml computed it, as the array ggml holds (``ne`` reversed: numpy's row-major order) and
saved under ``NAME@STEP`` (STEP counts the ``llama_decode`` calls: 0 for a prompt
evaluated at once, one per token with ``--token-by-token``). Settings as
``compare_llamacpp.py`` uses them: F32 KV cache, no flash attention, two threads.

Why: llama.cpp rounds activations to 8 bits before every quantized product, so a
one-ulp difference anywhere can grow into a visible one; to match it bit for bit, the
first operation that differs has to be found, by feeding ggml's own inputs of an
operation to tensorplug's kernel and comparing with ggml's output (see
``tests/test_attention_ggml.py`` for the attention done that way).
"""

from __future__ import annotations

import argparse
import ctypes
import re
import sys

import numpy as np


class _Tensor(ctypes.Structure):
    """The head of ggml's ``struct ggml_tensor`` (ggml.h; GGML_MAX_DIMS 4,
    GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10, GGML_MAX_NAME 64)."""

    _fields_ = [  # ctypes reads it as a class attribute
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument("--names", default=r"^(.*-[01]|result_output|result_norm)$")
    p.add_argument("--token-by-token", action="store_true")
    a = p.parse_args(argv)
    import llama_cpp as L

    wanted = re.compile(a.names)
    arrays: dict[str, np.ndarray] = {}
    step = [0]

    def hook(t_ptr: int, ask: bool, _user: int) -> bool:
        t = _Tensor.from_address(t_ptr)
        name = t.name.decode()
        if ask:
            return bool(wanted.search(name)) and t.type == 0  # F32 only
        shape = tuple(int(n) for n in t.ne)[::-1]
        strides = tuple(int(s) for s in t.nb)[::-1]
        span = sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + 4
        raw = (ctypes.c_char * span).from_address(t.data)
        view = np.lib.stride_tricks.as_strided(
            np.frombuffer(memoryview(raw), np.float32), shape=shape, strides=strides
        )
        key, seen = f"{name}@{step[0]}", 1
        while key in arrays:  # a name given again (Qcur after its reshape, its rope): NAME#2@STEP
            seen += 1
            key = f"{name}#{seen}@{step[0]}"
        arrays[key] = np.array(view)
        return True

    callback = L.ggml_backend_sched_eval_callback(hook)
    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    model = L.llama_model_load_from_file(a.model.encode(), mparams)
    if not model:
        raise SystemExit(f"llama.cpp could not load {a.model}")
    cparams = L.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 512, 512, 512
    cparams.n_threads = cparams.n_threads_batch = 2
    cparams.type_k = cparams.type_v = 0  # F32 cache
    cparams.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cparams.cb_eval = callback
    ctx = L.llama_init_from_model(model, cparams)
    vocab = L.llama_model_get_vocab(model)
    text = a.prompt.encode()
    ids = (L.llama_token * (len(text) + 8))()
    n = L.llama_tokenize(vocab, text, len(text), ids, len(ids), True, False)
    tokens = list(ids[:n])
    chunks = [[t] for t in tokens] if a.token_by_token else [tokens]
    for chunk in chunks:
        arr = (L.llama_token * len(chunk))(*chunk)
        if L.llama_decode(ctx, L.llama_batch_get_one(arr, len(chunk))) != 0:
            raise SystemExit("llama_decode failed")
        step[0] += 1
    arrays["tokens"] = np.array(tokens, np.int32)
    np.savez(a.out, allow_pickle=False, **arrays)
    print(f"{len(arrays) - 1} tensors of {len(tokens)} tokens written to {a.out}")
    L.llama_free(ctx)
    L.llama_model_free(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
