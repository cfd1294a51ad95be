"""tokenize / detokenize in bytes, with and without special tokens."""

import json
import os

from llama_cpp import Llama

llm = Llama(model_path=os.environ["MODEL"], vocab_only=True, verbose=False)
a = llm.tokenize(b"Hello, world! <|im_start|>user")
b = llm.tokenize(b"Hello, world! <|im_start|>user", special=True)
c = llm.tokenize(b" leading space", add_bos=False)
print(
    json.dumps(
        {
            "a": a,
            "b": b,
            "c": c,
            "back": llm.detokenize(b).decode("utf-8"),
            "back_special": llm.detokenize(b, special=True).decode("utf-8"),
            "bos": llm.token_bos(),
            "eos": llm.token_eos(),
            "n_vocab": llm.n_vocab(),
        }
    )
)
