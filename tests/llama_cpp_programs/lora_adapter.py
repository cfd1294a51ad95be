"""A LoRA adapter (``lora_path``, ``lora_scale``): greedy completions and their logprobs
change as the adapter's scale says. The adapter is made here, as llama.cpp's
``convert_lora_to_gguf.py`` writes one, from seeded random matrices."""

import json
import os
import tempfile

import gguf
import numpy as np
from llama_cpp import Llama

model = os.environ["MODEL"]
reader = gguf.GGUFReader(model)
shapes = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}  # (n_in, n_out)
targets = [
    "blk.0.attn_q.weight",
    "blk.3.attn_v.weight",
    "blk.5.ffn_up.weight",
    "blk.7.ffn_down.weight",
    "blk.9.attn_output.weight",
]
rng = np.random.default_rng(1234)
path = os.path.join(tempfile.mkdtemp(), "adapter.gguf")
writer = gguf.GGUFWriter(path, "llama")
writer.add_string("general.type", "adapter")
writer.add_string("adapter.type", "lora")
writer.add_float32("adapter.lora.alpha", 16.0)
for name in targets:
    n_in, n_out = shapes[name]
    a = (rng.standard_normal((8, n_in)) / np.sqrt(n_in)).astype(np.float32)
    b = (rng.standard_normal((n_out, 8)) * 0.2).astype(np.float16)
    writer.add_tensor(name + ".lora_a", a)
    writer.add_tensor(name + ".lora_b", b)
writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_tensors_to_file()
writer.close()

runs = {}
for scale in (0.0, 0.5, 1.0):
    llm = Llama(model_path=model, lora_path=path, lora_scale=scale, logits_all=True, verbose=False)
    out = llm.create_completion(
        "The capital of France is", max_tokens=16, temperature=0, logprobs=1
    )
    choice = out["choices"][0]
    runs[str(scale)] = {
        "text": choice["text"],
        "logprobs": [round(float(x), 3) for x in choice["logprobs"]["token_logprobs"]],
    }
print(json.dumps(runs))
