"""A GBNF grammar restricts the answer."""

import json
import os

from llama_cpp import Llama, LlamaGrammar

grammar = LlamaGrammar.from_string('root ::= "yes" | "no"')
llm = Llama(model_path=os.environ["MODEL"], n_ctx=256, verbose=False)
out = llm("Is the sky blue? Answer:", grammar=grammar, max_tokens=8, temperature=0)
print(json.dumps({"text": out["choices"][0]["text"].strip()}))
