"""With an F32 KV cache, the logprobs of a greedy completion."""

import json
import os

from llama_cpp import Llama

llm = Llama(
    model_path=os.environ["MODEL"], n_ctx=128, logits_all=True, type_k=0, type_v=0, verbose=False
)
out = llm("def fibonacci(n):", max_tokens=8, temperature=0, logprobs=2)
lp = out["choices"][0]["logprobs"]
print(
    json.dumps(
        {
            "text": out["choices"][0]["text"],
            "tokens": lp["tokens"],
            "offsets": lp["text_offset"],
            "logprobs": [None if x is None else round(float(x), 4) for x in lp["token_logprobs"]],
        }
    )
)
