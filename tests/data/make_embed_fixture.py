"""Writes embed_llamacpp.npz: llama.cpp's embeddings (llama-cpp-python's
``ModelRunner(embedding=True).embed(text)``, raw, not normalised) of a few texts for a tiny
random-weight BERT encoder (pooled as its file says, mean, and by its CLS token) and a
tiny llama decoder (mean and last pooling of the normed final hidden states; F32 KV
cache), with the
token ids llama.cpp's tokenizer gave each text, so that tests/llm/test_llama_embed.py holds
``ModelRunner.embed`` and the WordPiece tokenizer to llama.cpp without llama.cpp in CI.

The files are written by ``tensorplug_llm.tiny_bert.write_tiny_bert`` and
``tensorplug_llm.tiny.write_tiny_llama`` with the arguments in :data:`FILES`; the test
rebuilds them byte for byte. Regenerate (a developer step) with a Python that has
llama-cpp-python::

    python tests/data/make_embed_fixture.py --llama-python ~/peers/bin/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

#: name -> (writer, its keyword arguments)
FILES: dict[str, tuple[str, dict[str, object]]] = {
    "bert": ("bert", {"seed": 3, "pooling": "mean"}),
    "llama": ("llama", {"weight_type": "f32", "seed": 3}),
}
#: (file, pooling as llama.cpp's number: 1 mean, 2 cls, 3 last)
CASES = [("bert", 1), ("bert", 2), ("llama", 1), ("llama", 3)]
TEXTS = [
    "hello the world",
    "The tensor plug, a graph device!",
    "what time is it",
    "Naïve café: 中文 tests",
]

_LLAMA_CPP = """
import json, sys, numpy as np, llama_cpp
cases, texts = json.loads(sys.argv[2]), json.loads(sys.argv[3])
out, tokens = {}, {}
for path, name, pooling in cases:
    llm = llama_cpp.Llama(path, n_ctx=128, n_threads=2, embedding=True, pooling_type=pooling,
                          type_k=0, type_v=0, verbose=False)
    tokens[name] = [llm.tokenize(t.encode()) for t in texts]
    out[f"{name}-{pooling}"] = np.array([llm.embed(t) for t in texts], np.float32)
np.savez(sys.argv[1], version=llama_cpp.__version__, tokens=json.dumps(tokens), **out)
"""


def write(name: str, directory: Path) -> Path:
    """The tiny file ``name`` of :data:`FILES`, written into ``directory``."""
    from tensorplug_llm.tiny import write_tiny_llama
    from tensorplug_llm.tiny_bert import write_tiny_bert

    kind, kw = FILES[name]
    path = directory / f"{name}.gguf"
    return write_tiny_bert(path, **kw) if kind == "bert" else write_tiny_llama(path, **kw)  # type: ignore[arg-type]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-python", required=True, help="a Python with llama-cpp-python")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: str(write(name, Path(tmp))) for name in FILES}
        cases = json.dumps([(paths[name], name, pooling) for name, pooling in CASES])
        raw = Path(tmp) / "raw.npz"
        subprocess.run(
            [args.llama_python, "-c", _LLAMA_CPP, str(raw), cases, json.dumps(TEXTS)], check=True
        )
        got = dict(np.load(raw))
        out = Path(__file__).with_name("embed_llamacpp.npz")
        np.savez_compressed(out, llama_cpp=got.pop("version"), **got)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
