"""Writes arch_llamacpp.npz: llama.cpp's logits at every position of a prompt for tiny
random-weight files of the architectures added after Qwen (Phi-3 with and without its
LongRoPE factors, Gemma 2, Gemma 3, Qwen 3 MoE, SmolLM3, Granite, OLMo 2, Mistral 3 with
and without YaRN), F32 weights (Gemma 3: Q4_0) and F32 KV cache, so that
tests/llm/test_llama_archs.py holds the runner to llama.cpp's own graphs for them
(``src/models/phi3.cpp``, ``gemma2-iswa.cpp``, ``gemma3.cpp``, ``qwen3moe.cpp``,
``smollm3.cpp``, ``granite.cpp``, ``olmo2.cpp``, ``mistral3.cpp``) without llama.cpp in CI.

The files are written by ``tensorplug_llm.tiny.write_tiny_llama`` with the keyword
arguments in :data:`FILES`; the same call in the test rebuilds them byte for byte.
Each is evaluated with the context :data:`N_CTX` gives (Phi-3's long factors apply only
to a context beyond the original one). Regenerate (a developer step) with a Python
that has llama-cpp-python::

    python tests/data/make_arch_fixture.py --llama-python ~/peers/bin/python
"""

from __future__ import annotations

import llamacpp_logits

#: name -> write_tiny_llama keyword arguments
FILES: dict[str, dict[str, object]] = {
    "phi3": {"weight_type": "f32", "seed": 7, "arch": "phi3", "n_layer": 3},
    "phi3-longrope": {"weight_type": "f32", "seed": 7, "arch": "phi3", "long_rope": True},
    "gemma2": {"weight_type": "f32", "seed": 7, "arch": "gemma2", "n_layer": 4},
    # six blocks: five through a window of 4, the sixth global; Q4_0 weights, whose
    # products are llama.cpp's to the bit, so that nothing but the graph can differ
    "gemma3-q4_0": {
        "weight_type": "q4_0",
        "seed": 7,
        "arch": "gemma3",
        "n_layer": 6,
        "rope_base": 1e6,
    },
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


def main() -> None:
    llamacpp_logits.main(__doc__ or "", FILES, TOKENS, "arch_llamacpp.npz", n_ctx=N_CTX)


if __name__ == "__main__":
    main()
