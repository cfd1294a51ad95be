"""Mirostat 1.0 and 2.0 completions with seeds (llama-cpp-python's ``mirostat_mode``,
``mirostat_tau``, ``mirostat_eta``): the same seed draws the same tokens."""

import json
import os

from llama_cpp import Llama

llm = Llama(model_path=os.environ["MODEL"], seed=42, verbose=False)
runs = []
for mode, tau, eta in ((1, 5.0, 0.1), (2, 5.0, 0.1), (2, 3.0, 0.2), (1, 8.0, 0.3)):
    for prompt, seed in (("Once upon a time", 7), ("The best way to learn is", 1234)):
        out = llm.create_completion(
            prompt,
            max_tokens=32,
            temperature=0.8,
            seed=seed,
            mirostat_mode=mode,
            mirostat_tau=tau,
            mirostat_eta=eta,
        )
        runs.append(out["choices"][0]["text"])
print(json.dumps({"texts": runs}))
