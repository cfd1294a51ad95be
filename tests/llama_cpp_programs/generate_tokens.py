"""Llama.generate as its docstring shows, stopped by the caller."""

import json
import os

from llama_cpp import Llama

llm = Llama(model_path=os.environ["MODEL"], n_ctx=128, verbose=False)
tokens = llm.tokenize(b"Hello, world!")
got = []
for token in llm.generate(tokens, top_k=40, top_p=0.95, temp=0.0, repeat_penalty=1.0):
    got.append(token)
    if len(got) == 10 or token == llm.token_eos():
        break
print(json.dumps({"tokens": got, "text": llm.detokenize(got).decode("utf-8")}))
