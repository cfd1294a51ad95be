"""save_state / load_state: a branch, and back to where it was."""

import json
import os

from llama_cpp import Llama

llm = Llama(model_path=os.environ["MODEL"], n_ctx=256, verbose=False)
llm.eval(llm.tokenize(b"The first three prime numbers are"))
state = llm.save_state()
first = [llm.sample(temp=0)]
llm.eval(first)
first.append(llm.sample(temp=0))
llm.reset()
llm.eval(llm.tokenize(b"Something else entirely"))
llm.load_state(state)
n = llm.n_tokens
again = llm.create_completion(llm.input_ids[:n].tolist(), max_tokens=2, temperature=0)
print(
    json.dumps(
        {
            "n_tokens": n,
            "same": state.n_tokens == n,
            "text": again["choices"][0]["text"],
            "first": llm.detokenize(first).decode("utf-8"),
        }
    )
)
