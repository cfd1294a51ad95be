"""The tokenizer object a program gets from the model."""

import json
import os

from llama_cpp import Llama

llm = Llama(model_path=os.environ["MODEL"], vocab_only=True, verbose=False)
tok = llm.tokenizer()
ids = tok.encode("Hello there")
print(
    json.dumps(
        {
            "ids": ids,
            "text": tok.decode(ids),
            "bytes": tok.detokenize(ids).decode("utf-8"),
            "same": tok.tokenize(b"Hello there") == llm.tokenize(b"Hello there"),
        }
    )
)
