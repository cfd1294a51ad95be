"""A Q8_0 KV cache, K and V (half the memory of the default F16 one), with flash
attention as llama.cpp needs for a quantized V: a greedy completion and its logprobs."""

import json
import os

from llama_cpp import Llama

llm = Llama(
    model_path=os.environ["MODEL"],
    n_ctx=256,
    type_k=8,  # GGML_TYPE_Q8_0
    type_v=8,
    flash_attn=True,
    logits_all=True,
    verbose=False,
)
out = llm("The three primary colors are", max_tokens=16, temperature=0, logprobs=1)
lp = out["choices"][0]["logprobs"]
print(
    json.dumps(
        {
            "text": out["choices"][0]["text"],
            "logprobs": [round(float(x), 4) for x in lp["token_logprobs"]],
        }
    )
)
