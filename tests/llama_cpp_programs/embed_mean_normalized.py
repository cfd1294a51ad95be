"""Mean-pooled, normalized embeddings of several texts, and their similarity."""

import json
import os

import numpy as np
from llama_cpp import Llama

llm = Llama(
    model_path=os.environ["MODEL"], embedding=True, pooling_type=1, n_ctx=128, verbose=False
)
vectors = np.asarray(llm.embed(["a cat sat on the mat", "a dog lay on the rug"], normalize=True))
print(
    json.dumps(
        {
            "shape": list(vectors.shape),
            "norms": [round(float(n), 4) for n in np.linalg.norm(vectors, axis=1)],
            "cosine": round(float(vectors[0] @ vectors[1]), 2),
        }
    )
)
