"""What a program asks of the model: sizes, special tokens, metadata."""

import json
import os

from llama_cpp import Llama

llm = Llama(model_path=os.environ["MODEL"], n_ctx=0, verbose=False)
print(
    json.dumps(
        {
            "n_ctx": llm.n_ctx(),
            "n_vocab": llm.n_vocab(),
            "n_embd": llm.n_embd(),
            "bos": llm.token_bos(),
            "eos": llm.token_eos(),
            "arch": llm.metadata["general.architecture"],
            "ctx_len": llm.metadata["llama.context_length"],
            "model_path_ok": llm.model_path == os.environ["MODEL"],
        }
    )
)
