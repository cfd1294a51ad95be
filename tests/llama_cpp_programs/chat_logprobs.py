"""Chat with logprobs (llama-cpp-python needs logits_all for them)."""

import json
import os

from llama_cpp import Llama

llm = Llama(
    model_path=os.environ["MODEL"], n_ctx=256, logits_all=True, type_k=0, type_v=0, verbose=False
)
r = llm.create_chat_completion(
    messages=[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name a fruit."},
    ],
    temperature=0,
    max_tokens=8,
    logprobs=True,
    top_logprobs=2,
)
content = r["choices"][0]["logprobs"]["content"]
print(
    json.dumps(
        {
            "text": r["choices"][0]["message"]["content"],
            "tokens": [c["token"] for c in content],
            "logprobs": [round(float(c["logprob"]), 4) for c in content],
            "tops": [len(c["top_logprobs"]) for c in content],
        }
    )
)
