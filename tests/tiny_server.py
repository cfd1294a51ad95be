"""A tiny random-weight model behind the HTTP app, with what the runner itself says it
should answer (greedy continuation, first logprobs), computed before the app exists."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensorplug_llm.api import LLM
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.sampling import Sampler, SamplerParams
from tensorplug_llm.serve_cli import TINY_CHAT_TEMPLATE
from tensorplug_llm.tiny import write_tiny_llama
from tensorplug_llm.tokenizer import StreamDecoder

__all__ = ["PROMPT", "TinyModel", "tiny_model"]

PROMPT = "the of and to in"


@dataclass
class TinyModel:
    llama: ModelRunner
    llm: LLM
    ids: list[int]  # PROMPT's tokens (BOS first)
    greedy: list[int]  # PROMPT's greedy continuation, 24 tokens
    greedy_text: str
    first_logp: np.ndarray  # log-softmax of the logits after PROMPT

    def close(self) -> None:
        self.llm.close()
        self.llama.close()


def tiny_model(folder: Path, name: str = "tiny.gguf", n_ctx: int = 256) -> TinyModel:
    path = write_tiny_llama(
        folder / name, "q8_0", 0, metadata={"tokenizer.chat_template": TINY_CHAT_TEMPLATE}
    )
    llama = ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=n_ctx, warmup=False)
    assert llama.vocab is not None
    ids = llama.vocab.encode(PROMPT)
    logits = llama.eval(ids)
    z = logits.astype(np.float64) - logits.max()
    first_logp = z - np.log(np.exp(z).sum())
    llama.reset()
    greedy = llama.generate(ids, 24, Sampler(SamplerParams(0.0)), stop_at_eos=False).tokens
    assert not set(greedy) & llama.vocab.eog, "pick another seed: greedy hits EOS"
    llama.reset()
    dec = StreamDecoder(llama.vocab)
    text = "".join(dec.feed(t) for t in greedy) + dec.flush()
    llm = LLM(llama, n_parallel=2, model_name=name)
    return TinyModel(llama, llm, ids, greedy, text, first_logp)
