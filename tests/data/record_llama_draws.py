"""Print llama.cpp's seeded draws on fixed logits: the reference of
``tests/llm/test_llama_sampling.py::LLAMA_CPP_DRAWS``.

Run with an interpreter that has llama-cpp-python 0.3.36 (the test suite's reference):
``python tests/data/record_llama_draws.py``. It builds llama.cpp's own sampler chain
(top-k, top-p, min-p, temperature, dist, in that order, each only where the case sets
it) through llama-cpp-python's ctypes API, applies it to the same logits the test uses,
and prints twelve tokens a case, each accepted before the next draw as a generation
accepts it.
"""

from __future__ import annotations

import ctypes

import llama_cpp as lc
import numpy as np

#: name, seed, temperature, top_k, top_p, min_p (0 / 1.0 / 0.0: that stage left out)
CASES = [
    ("small", 42, 1.0, 0, 1.0, 0.0),
    ("small", 3, 1.3, 5, 0.5, 0.0),
    ("big", 7, 0.8, 40, 0.95, 0.05),
    ("big", 42, 0.7, 0, 1.0, 0.0),
]
LOGITS = {
    "small": np.array([1.0, 3.0, -2.0, 3.0, 0.5, 2.0, -1.0, 0.0], dtype=np.float32),
    "big": (np.random.default_rng(5).standard_normal(1000) * 3.0).astype(np.float32),
}


def draws(logits: np.ndarray, seed: int, temperature: float, top_k: int, top_p: float,
          min_p: float, n: int = 12) -> list[int]:  # fmt: skip
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    if top_k > 0:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_k(top_k))
    if top_p < 1.0:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(top_p, 1))
    if min_p > 0.0:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_min_p(min_p, 1))
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(temperature))
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(seed))
    out = []
    for _ in range(n):
        data = (lc.llama_token_data * logits.size)()
        for i, value in enumerate(logits):
            data[i].id, data[i].logit, data[i].p = i, float(value), 0.0
        candidates = lc.llama_token_data_array(data=data, size=logits.size, selected=-1,
                                               sorted=False)  # fmt: skip
        lc.llama_sampler_apply(chain, ctypes.byref(candidates))
        token = int(data[candidates.selected].id)
        lc.llama_sampler_accept(chain, token)
        out.append(token)
    lc.llama_sampler_free(chain)
    return out


def main() -> None:
    for name, seed, temperature, top_k, top_p, min_p in CASES:
        drawn = draws(LOGITS[name], seed, temperature, top_k, top_p, min_p)
        print(f'("{name}", {seed}, {temperature}, {top_k}, {top_p}, {min_p}, {drawn}),')


if __name__ == "__main__":
    main()
