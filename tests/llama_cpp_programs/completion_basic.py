"""The README's first example: a completion with stop strings and echo."""

import json
import os

from llama_cpp import Llama

llm = Llama(model_path=os.environ["MODEL"], verbose=False)
output = llm(
    "Q: Name the planets in the solar system? A: ",
    max_tokens=32,
    stop=["Q:", "\n"],
    echo=True,
    temperature=0.0,
)
print(
    json.dumps(
        {
            "text": output["choices"][0]["text"],
            "finish_reason": output["choices"][0]["finish_reason"],
            "usage": output["usage"],
            "object": output["object"],
        }
    )
)
