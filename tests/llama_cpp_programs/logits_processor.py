"""A logits processor that forbids a token, and a stopping criterion."""

import json
import os

import numpy as np
from llama_cpp import Llama, LogitsProcessorList, StoppingCriteriaList

llm = Llama(model_path=os.environ["MODEL"], n_ctx=256, verbose=False)
banned = llm.tokenize(b" Paris", add_bos=False)[0]


def ban(input_ids, scores):
    scores[banned] = -np.inf
    return scores


def five(input_ids, logits):
    return len(input_ids) >= 12


out = llm(
    "The capital of France is",
    max_tokens=20,
    temperature=0,
    logits_processor=LogitsProcessorList([ban]),
    stopping_criteria=StoppingCriteriaList([five]),
)
print(
    json.dumps(
        {
            "text": out["choices"][0]["text"],
            "finish_reason": out["choices"][0]["finish_reason"],
            "has_paris": "Paris" in out["choices"][0]["text"],
        }
    )
)
