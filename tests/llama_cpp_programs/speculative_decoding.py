"""Prompt lookup decoding, as llama-cpp-python's README shows it: a draft model
proposes tokens, generation keeps those it agrees with. The greedy text is what
generation without a draft gives; the logprobs move in their last digits, as the steps
now evaluate several tokens at once."""

import json
import os

from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

path = os.environ["MODEL"]
plain = Llama(model_path=path, logits_all=True, verbose=False)
llm = Llama(
    model_path=path, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10), verbose=False
)
prompt = (
    "Repeat the list exactly.\nList: apples, pears, plums, cherries, grapes, figs.\n"
    "Repeated list: apples, pears,"
)
runs = {}
for name, model in (("plain", plain), ("draft", llm)):
    out = model.create_completion(prompt, max_tokens=24, temperature=0, logprobs=2)
    choice = out["choices"][0]
    runs[name] = {
        "text": choice["text"],
        "tokens": choice["logprobs"]["tokens"],
        "logprobs": [round(float(x), 3) for x in choice["logprobs"]["token_logprobs"]],
    }
code = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"
out = llm(code, max_tokens=20, temperature=0)
runs["code"] = out["choices"][0]["text"]
print(json.dumps(runs))
