"""Writes iq4_llamacpp.npz: llama.cpp's logits at every position of a prompt for tiny
random-weight llama files whose matrices are IQ4_NL and IQ4_XS, so that
tests/llm/test_llama_iq4.py holds the runner to llama.cpp on those weight types without
llama.cpp in CI.

The files are written by ``tensorplug_llm.tiny.write_tiny_llama`` (its weights encoded
by ``tensorplug.quants``, byte-identical to ggml's encoder) with the seed and
dimensions in :data:`FILES`; the same call in the test rebuilds them byte for byte.
IQ4_XS rows are 256-value super-blocks, hence the wider model. Regenerate (a developer
step) with a Python that has llama-cpp-python::

    python tests/data/make_iq4_llama_fixture.py --llama-python ~/peers/bin/python
"""

from __future__ import annotations

import llamacpp_logits

_DIMS = {"n_embd": 256, "n_ff": 512, "n_head": 4, "n_head_kv": 2, "n_layer": 2}
#: name -> write_tiny_llama keyword arguments
FILES: dict[str, dict[str, object]] = {
    "iq4_nl": {"weight_type": "iq4_nl", "seed": 7, **_DIMS},
    "iq4_xs": {"weight_type": "iq4_xs", "seed": 7, **_DIMS},
}
TOKENS = [1, 300, 301, 302, 310, 259, 288, 270, 305, 311, 299]


def main() -> None:
    llamacpp_logits.main(__doc__ or "", FILES, TOKENS, "iq4_llamacpp.npz")


if __name__ == "__main__":
    main()
