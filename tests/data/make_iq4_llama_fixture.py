"""Writes iq4_llamacpp.npz: llama.cpp's logits at every position of a prompt for tiny
random-weight llama files whose matrices are IQ4_NL and IQ4_XS, so that
tests/test_llama_iq4.py holds the runner to llama.cpp on those weight types without
llama.cpp in CI.

The files are written by ``tensorplug_llm.tiny.write_tiny_llama`` (its weights encoded
by ``tensorplug.quants``, byte-identical to ggml's encoder) with the seed and
dimensions in :data:`FILES`; the same call in the test rebuilds them byte for byte.
IQ4_XS rows are 256-value super-blocks, hence the wider model. Regenerate (a developer
step) with a Python that has llama-cpp-python::

    python tests/data/make_iq4_llama_fixture.py --llama-python ~/peers/bin/python
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np

_DIMS = {"n_embd": 256, "n_ff": 512, "n_head": 4, "n_head_kv": 2, "n_layer": 2}
#: name -> write_tiny_llama keyword arguments
FILES: dict[str, dict[str, object]] = {
    "iq4_nl": {"weight_type": "iq4_nl", "seed": 7, **_DIMS},
    "iq4_xs": {"weight_type": "iq4_xs", "seed": 7, **_DIMS},
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
        out = Path(__file__).with_name("iq4_llamacpp.npz")
        np.savez_compressed(out, tokens=np.array(TOKENS), llama_cpp=got["version"], **arrays)
    print(f"wrote {out} (llama-cpp-python {got['version']})")


if __name__ == "__main__":
    main()
