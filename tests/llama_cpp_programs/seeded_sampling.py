"""Sampled (not greedy) completions and a chat turn with seeds: the same seed draws the
same tokens."""

import json
import os

from llama_cpp import Llama

llm = Llama(model_path=os.environ["MODEL"], seed=42, verbose=False)
texts = [
    llm.create_completion(prompt, max_tokens=24, temperature=0.8, seed=7)["choices"][0]["text"]
    for prompt in ("Once upon a time", "The capital of France is", "def fib(n):")
]
chat = llm.create_chat_completion(
    [{"role": "user", "content": "Tell me a joke."}], max_tokens=24, seed=11
)
texts.append(chat["choices"][0]["message"]["content"])
print(json.dumps({"texts": texts}))
