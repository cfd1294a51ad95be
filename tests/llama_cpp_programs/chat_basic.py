"""create_chat_completion with the model's own chat template, greedy."""

import json
import os

from llama_cpp import Llama

llm = Llama(model_path=os.environ["MODEL"], n_ctx=512, verbose=False)
r = llm.create_chat_completion(
    messages=[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    temperature=0,
    max_tokens=24,
)
msg = r["choices"][0]["message"]
print(
    json.dumps(
        {
            "role": msg["role"],
            "content": msg["content"],
            "object": r["object"],
            "finish_reason": r["choices"][0]["finish_reason"],
            "usage": r["usage"],
        }
    )
)
