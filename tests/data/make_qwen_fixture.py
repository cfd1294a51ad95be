"""Writes qwen_llamacpp.npz: llama.cpp's logits at every position of a prompt for the
tiny random-weight Qwen 2 and Qwen 3 files (F32 weights, F32 KV cache), so that
tests/llm/test_llama_qwen.py holds the runner to llama.cpp's own graphs for those
architectures (``src/models/qwen2.cpp``, ``qwen3.cpp``) without llama.cpp in CI.

The files are written by ``tensorplug_llm.tiny.write_tiny_llama`` with the seed and
dimensions in :data:`FILES`; the same call in the test rebuilds them byte for byte.
Regenerate (a developer step) with a Python that has llama-cpp-python::

    python tests/data/make_qwen_fixture.py --llama-python ~/peers/bin/python
"""

from __future__ import annotations

import llamacpp_logits

#: name -> write_tiny_llama keyword arguments
FILES: dict[str, dict[str, object]] = {
    "qwen2": {"weight_type": "f32", "seed": 5, "arch": "qwen2", "n_layer": 3},
    "qwen3": {"weight_type": "f32", "seed": 5, "arch": "qwen3", "n_layer": 3},
}
TOKENS = [1, 300, 301, 302, 310, 259, 288, 270, 305, 311, 299]


def main() -> None:
    llamacpp_logits.main(__doc__ or "", FILES, TOKENS, "qwen_llamacpp.npz")


if __name__ == "__main__":
    main()
