"""A chat format chosen by name."""

import json
import os

from llama_cpp import Llama

llm = Llama(model_path=os.environ["MODEL"], chat_format="chatml", n_ctx=512, verbose=False)
r = llm.create_chat_completion(
    messages=[{"role": "user", "content": "Name a color."}], temperature=0, max_tokens=12
)
print(json.dumps({"content": r["choices"][0]["message"]["content"]}))
