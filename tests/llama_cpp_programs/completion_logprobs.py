"""create_completion with logprobs (needs logits_all=True), greedy."""

import json
import os

from llama_cpp import Llama

llm = Llama(model_path=os.environ["MODEL"], logits_all=True, n_ctx=256, verbose=False)
out = llm.create_completion("The capital of France is", max_tokens=6, temperature=0, logprobs=3)
choice = out["choices"][0]
lp = choice["logprobs"]
print(
    json.dumps(
        {
            "text": choice["text"],
            "tokens": lp["tokens"],
            "text_offset": lp["text_offset"],
            "token_logprobs": [float(x) for x in lp["token_logprobs"]],
            "top": [sorted(t) for t in lp["top_logprobs"]],
        }
    )
)
