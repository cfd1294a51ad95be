"""response_format json_object with a schema (llama-cpp-python's spelling)."""

import json
import os

from llama_cpp import Llama

llm = Llama(model_path=os.environ["MODEL"], n_ctx=512, verbose=False)
r = llm.create_chat_completion(
    messages=[{"role": "user", "content": "Give me a person with a name and an age as JSON."}],
    response_format={
        "type": "json_object",
        "schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        },
    },
    temperature=0,
    max_tokens=48,
)
data = json.loads(r["choices"][0]["message"]["content"])
print(json.dumps({"keys": sorted(data), "age_is_int": isinstance(data["age"], int)}))
