"""Writes rounding_llamacpp.npz: llama.cpp's logits at every position of a prompt for a
tiny random-weight llama file of each weight type (F32 KV cache), so that
tests/test_cpu_rounding.py holds the CPU backend to llama.cpp's own rounding of the
activations, type by type (Q8_0, Q8_1, Q8_K, F16), without llama.cpp in CI.

The files are written by ``tensorplug_llm.tiny.write_tiny_llama`` with the seed and
dimensions in :data:`FILES` (rows of 256 values, so that every K-quant fits); the same
call in the test rebuilds them byte for byte. Regenerate (a developer step) with a
Python that has llama-cpp-python::

    python tests/data/make_rounding_fixture.py --llama-python ~/peers/bin/python
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np

#: every weight type the CPU multiplies, F32 aside (its activations are not rounded)
TYPES = ["f16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]
#: write_tiny_llama's dimensions for every file
DIMS: dict[str, int] = {"n_embd": 256, "n_ff": 512, "n_head": 4, "n_head_kv": 2, "n_layer": 2}
SEED = 11
#: name -> write_tiny_llama keyword arguments
FILES: dict[str, dict[str, object]] = {t: {"weight_type": t, "seed": SEED, **DIMS} for t in TYPES}
TOKENS = [1, 300, 301, 302, 310, 259, 288, 270, 305, 311, 299]

_LLAMA_CPP = """
import sys, numpy as np, llama_cpp
tokens = [int(t) for t in sys.argv[2].split(",")]
out = {}
for path in sys.argv[3:]:
    llm = llama_cpp.Llama(path, n_ctx=64, n_threads=2, logits_all=True, type_k=0, type_v=0,
                          verbose=False)
    llm.eval(tokens)
    out[path] = np.array(llm.scores[: llm.n_tokens], np.float32)
np.savez(sys.argv[1], *[out[p] for p in sys.argv[3:]], version=llama_cpp.__version__)
"""


def main() -> None:
    from tensorplug_llm.tiny import write_tiny_llama

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-python", required=True, help="a Python with llama-cpp-python")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = [str(write_tiny_llama(Path(tmp) / f"{n}.gguf", **kw)) for n, kw in FILES.items()]  # type: ignore[arg-type]
        raw = Path(tmp) / "raw.npz"
        tokens = ",".join(map(str, TOKENS))
        subprocess.run([args.llama_python, "-c", _LLAMA_CPP, str(raw), tokens, *paths], check=True)
        got = np.load(raw)
        arrays = {name: got[f"arr_{i}"] for i, name in enumerate(FILES)}
        out = Path(__file__).with_name("rounding_llamacpp.npz")
        np.savez_compressed(out, tokens=np.array(TOKENS), llama_cpp=got["version"], **arrays)
    print(f"wrote {out} (llama-cpp-python {got['version']})")


if __name__ == "__main__":
    main()
