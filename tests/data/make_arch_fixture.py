"""Writes arch_llamacpp.npz: llama.cpp's logits at every position of a prompt for tiny
random-weight files of the architectures added after Qwen (Phi-3 with and without its
LongRoPE factors, Gemma 2, Qwen 3 MoE, SmolLM3, Granite, OLMo 2, Mistral 3 with and
without YaRN), F32 weights and F32 KV cache, so that tests/test_llama_archs.py holds the
runner to llama.cpp's own graphs for them (``src/models/phi3.cpp``, ``gemma2-iswa.cpp``,
``qwen3moe.cpp``, ``smollm3.cpp``, ``granite.cpp``, ``olmo2.cpp``, ``mistral3.cpp``)
without llama.cpp in CI.

The files are written by ``tensorplug_llm.tiny.write_tiny_llama`` with the keyword
arguments in :data:`FILES`; the same call in the test rebuilds them byte for byte.
Each is evaluated with the context :data:`N_CTX` gives (Phi-3's long factors apply only
to a context beyond the original one). Regenerate (a developer step) with a Python
that has llama-cpp-python::

    python tests/data/make_arch_fixture.py --llama-python ~/peers/bin/python
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np

#: name -> write_tiny_llama keyword arguments
FILES: dict[str, dict[str, object]] = {
    "phi3": {"weight_type": "f32", "seed": 7, "arch": "phi3", "n_layer": 3},
    "phi3-longrope": {"weight_type": "f32", "seed": 7, "arch": "phi3", "long_rope": True},
    "gemma2": {"weight_type": "f32", "seed": 7, "arch": "gemma2", "n_layer": 4},
    "qwen3moe": {"weight_type": "f32", "seed": 7, "arch": "qwen3moe", "n_layer": 3},
    "smollm3": {"weight_type": "f32", "seed": 7, "arch": "smollm3", "n_layer": 4},
    "granite": {"weight_type": "f32", "seed": 7, "arch": "granite"},
    "olmo2": {"weight_type": "f32", "seed": 7, "arch": "olmo2"},
    "mistral3": {"weight_type": "f32", "seed": 7, "arch": "mistral3"},
    "mistral3-yarn": {
        "weight_type": "f32",
        "seed": 7,
        "arch": "mistral3",
        "rope_scaling": ("yarn", 4.0),
    },
}
#: name -> the context both engines run with (default 64)
N_CTX: dict[str, int] = {"phi3-longrope": 128}
TOKENS = [1, 300, 301, 302, 310, 259, 288, 270, 305, 311, 299]

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


def main() -> None:
    from tensorplug_llm.tiny import write_tiny_llama

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-python", required=True, help="a Python with llama-cpp-python")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [
            f"{write_tiny_llama(Path(tmp) / f'{name}.gguf', **kw)}@{N_CTX.get(name, 64)}"  # type: ignore[arg-type]
            for name, kw in FILES.items()
        ]
        raw = Path(tmp) / "raw.npz"
        tokens = ",".join(map(str, TOKENS))
        subprocess.run([args.llama_python, "-c", _LLAMA_CPP, str(raw), tokens, *runs], check=True)
        got = np.load(raw)
        arrays = {name: got[f"arr_{i}"] for i, name in enumerate(FILES)}
        out = Path(__file__).with_name("arch_llamacpp.npz")
        np.savez_compressed(out, tokens=np.array(TOKENS), llama_cpp=got["version"], **arrays)
    print(f"wrote {out} (llama-cpp-python {got['version']})")


if __name__ == "__main__":
    main()
