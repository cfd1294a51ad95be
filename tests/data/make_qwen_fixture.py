"""Writes qwen_llamacpp.npz: llama.cpp's logits at every position of a prompt for the
tiny random-weight Qwen 2 and Qwen 3 files (F32 weights, F32 KV cache), so that
tests/test_llama_qwen.py holds the runner to llama.cpp's own graphs for those
architectures (``src/models/qwen2.cpp``, ``qwen3.cpp``) without llama.cpp in CI.

The files are written by ``tensorplug_llm.tiny.write_tiny_llama`` with the seed and
dimensions in :data:`FILES`; the same call in the test rebuilds them byte for byte.
Regenerate (a developer step) with a Python that has llama-cpp-python::

    python tests/data/make_qwen_fixture.py --llama-python ~/peers/bin/python
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np

#: name -> write_tiny_llama keyword arguments
FILES: dict[str, dict[str, object]] = {
    "qwen2": {"weight_type": "f32", "seed": 5, "arch": "qwen2", "n_layer": 3},
    "qwen3": {"weight_type": "f32", "seed": 5, "arch": "qwen3", "n_layer": 3},
}
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
        out = Path(__file__).with_name("qwen_llamacpp.npz")
        np.savez_compressed(out, tokens=np.array(TOKENS), llama_cpp=got["version"], **arrays)
    print(f"wrote {out} (llama-cpp-python {got['version']})")


if __name__ == "__main__":
    main()
