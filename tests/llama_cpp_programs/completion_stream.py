"""Streaming a completion, chunk by chunk, stopping at a period."""

import json
import os

from llama_cpp import Llama

llm = Llama(model_path=os.environ["MODEL"], n_ctx=256, verbose=False)
texts, finishes = [], []
for chunk in llm("Once upon a time", max_tokens=24, temperature=0, stream=True, stop=["."]):
    texts.append(chunk["choices"][0]["text"])
    finishes.append(chunk["choices"][0]["finish_reason"])
    assert chunk["object"] == "text_completion"
print(
    json.dumps(
        {
            "text": "".join(texts),
            "last_finish": finishes[-1],
            "nones": finishes[:-1] == [None] * (len(finishes) - 1),
        }
    )
)
