"""Records llama.cpp's logits at every prompt position for tiny random-weight files.

The ``make_*_fixture.py`` scripts that hold an architecture or a weight type to llama.cpp
differ only in the files they write and where the numbers go: each calls :func:`main`
with its ``FILES`` (name -> ``write_tiny_llama`` keyword arguments), ``TOKENS`` and
output name. The files are written here, evaluated in a Python that has
llama-cpp-python (F32 KV cache, every position's logits), and saved as
``tests/data/<out_name>`` with one array per file name, the tokens and llama-cpp-python's
version.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

#: the context a file runs with unless its script says otherwise
N_CTX = 64

_LLAMA_CPP = """
import sys, numpy as np, llama_cpp
tokens = [int(t) for t in sys.argv[2].split(",")]
out = []
for arg in sys.argv[3:]:
    path, n_ctx = arg.rsplit("@", 1)
    llm = llama_cpp.Llama(path, n_ctx=int(n_ctx), n_threads=2, logits_all=True, type_k=0,
                          type_v=0, verbose=False)
    llm.eval(tokens)
    out.append(np.array(llm.scores[: llm.n_tokens], np.float32))
np.savez(sys.argv[1], *out, version=llama_cpp.__version__)
"""


def main(
    description: str,
    files: Mapping[str, Mapping[str, object]],
    tokens: Sequence[int],
    out_name: str,
    n_ctx: Mapping[str, int] | None = None,
) -> None:
    """Parse ``--llama-python``, record every file's logits, write ``out_name``."""
    from tensorplug_llm.tiny import write_tiny_llama

    p = argparse.ArgumentParser(description=description.split("\n\n")[0])
    p.add_argument("--llama-python", required=True, help="a Python with llama-cpp-python")
    args = p.parse_args()
    contexts = n_ctx or {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = [
            f"{write_tiny_llama(Path(tmp) / f'{name}.gguf', **kw)}@{contexts.get(name, N_CTX)}"  # type: ignore[arg-type]
            for name, kw in files.items()
        ]
        raw = Path(tmp) / "raw.npz"
        ids = ",".join(map(str, tokens))
        subprocess.run([args.llama_python, "-c", _LLAMA_CPP, str(raw), ids, *runs], check=True)
        got = np.load(raw)
        arrays = {name: got[f"arr_{i}"] for i, name in enumerate(files)}
        out = Path(__file__).with_name(out_name)
        np.savez_compressed(out, tokens=np.array(tokens), llama_cpp=got["version"], **arrays)
    print(f"wrote {out} (llama-cpp-python {got['version']})")
