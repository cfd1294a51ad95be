"""The low-level loop: eval, sample, eval again; n_tokens and input_ids follow."""

import json
import os

from llama_cpp import Llama

llm = Llama(model_path=os.environ["MODEL"], n_ctx=128, verbose=False)
tokens = llm.tokenize(b"The quick brown fox")
llm.eval(tokens)
out = []
for _ in range(8):
    t = llm.sample(temp=0)
    out.append(t)
    llm.eval([t])
print(
    json.dumps(
        {
            "tokens": out,
            "n_tokens": llm.n_tokens,
            "input_ids": llm.input_ids[: llm.n_tokens].tolist(),
            "text": llm.detokenize(out).decode("utf-8"),
        }
    )
)
