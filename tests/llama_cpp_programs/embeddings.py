"""Embeddings of a decoder model: per-token rows without pooling in the file."""

import json
import os

import numpy as np
from llama_cpp import Llama

llm = Llama(model_path=os.environ["MODEL"], embedding=True, n_ctx=128, verbose=False)
e = llm.create_embedding("Hello, world!")
rows = np.asarray(e["data"][0]["embedding"], dtype=np.float64)
print(
    json.dumps(
        {
            "shape": list(rows.shape),
            "usage": e["usage"],
            "object": e["object"],
            "first": [round(float(x), 3) for x in rows.reshape(-1)[:4]],
            "norm": round(float(np.linalg.norm(rows)), 2),
        }
    )
)
