"""Writes rounding_llamacpp.npz: llama.cpp's logits at every position of a prompt for a
tiny random-weight llama file of each weight type (F32 KV cache), so that
tests/cpu/test_cpu_rounding.py holds the CPU backend to llama.cpp's own rounding of the
activations, type by type (Q8_0, Q8_1, Q8_K, F16), without llama.cpp in CI.

The files are written by ``tensorplug_llm.tiny.write_tiny_llama`` with the seed and
dimensions in :data:`FILES` (rows of 256 values, so that every K-quant fits); the same
call in the test rebuilds them byte for byte. Regenerate (a developer step) with a
Python that has llama-cpp-python::

    python tests/data/make_rounding_fixture.py --llama-python ~/peers/bin/python
"""

from __future__ import annotations

import llamacpp_logits

#: every weight type the CPU multiplies, F32 aside (its activations are not rounded)
TYPES = ["f16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]
#: write_tiny_llama's dimensions for every file
DIMS: dict[str, int] = {"n_embd": 256, "n_ff": 512, "n_head": 4, "n_head_kv": 2, "n_layer": 2}
SEED = 11
#: name -> write_tiny_llama keyword arguments
FILES: dict[str, dict[str, object]] = {t: {"weight_type": t, "seed": SEED, **DIMS} for t in TYPES}
TOKENS = [1, 300, 301, 302, 310, 259, 288, 270, 305, 311, 299]


def main() -> None:
    llamacpp_logits.main(__doc__ or "", FILES, TOKENS, "rounding_llamacpp.npz")


if __name__ == "__main__":
    main()
