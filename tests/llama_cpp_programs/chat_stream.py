"""A streamed chat reply, put back together from its deltas."""

import json
import os

from llama_cpp import Llama

llm = Llama(model_path=os.environ["MODEL"], n_ctx=512, verbose=False)
parts, roles, finish = [], [], None
for chunk in llm.create_chat_completion(
    messages=[{"role": "user", "content": "Say hello in French."}],
    temperature=0,
    max_tokens=16,
    stream=True,
):
    delta = chunk["choices"][0]["delta"]
    if "role" in delta:
        roles.append(delta["role"])
    if delta.get("content"):
        parts.append(delta["content"])
    finish = chunk["choices"][0]["finish_reason"] or finish
    assert chunk["object"] == "chat.completion.chunk"
print(json.dumps({"content": "".join(parts), "roles": roles, "finish": finish}))
