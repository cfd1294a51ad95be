"""A RAM prompt cache: the second call with the same prefix starts from the saved state."""

import json
import os

from llama_cpp import Llama, LlamaCache

llm = Llama(model_path=os.environ["MODEL"], n_ctx=256, verbose=False)
llm.set_cache(LlamaCache())
a = llm("The history of Rome begins", max_tokens=8, temperature=0)["choices"][0]["text"]
llm.reset()
b = llm("The history of Rome begins", max_tokens=8, temperature=0)["choices"][0]["text"]
print(json.dumps({"same": a == b, "text": a, "cached": len(llm.cache.cache_state) >= 1}))
