"""llama-cpp-python's ``Llama``, on tensorplug.

A program written for llama-cpp-python runs with its import changed
(``from tensorplug_llm import Llama``): the same keywords, methods, attributes, result
dicts, chunks and exceptions. Underneath, a :class:`~tensorplug_llm.runner.ModelRunner`
holds the model on this machine's devices and a :class:`~.session.Session` keeps the
one sequence llama-cpp-python's API is about. Completions follow llama-cpp-python's
rules (:mod:`.completion`); conversations are rendered and answered by the same layer
as the server's (:class:`~tensorplug_llm.api.LLM`), so that tools and OpenAI's
``response_format`` behave as they do over HTTP. ``docs/python-api.md`` lists what
differs from llama-cpp-python, and why.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..api import LLM
from ..constraint import constraint_for
from ..prefix import common_prefix
from ..tokenizer import Vocab
from .completion import CompletionRequest, complete, logits_to_logprobs, prompt_tokens
from .direct import DirectGenerator
from .options import (
    LLAMA_DEFAULT_SEED,
    LLAMA_SPLIT_MODE_NONE,
    LLAMA_SPLIT_MODE_ROW,
    LoadOptions,
    load_options,
)
from .session import SampleSettings, Session
from .state import LlamaState, cache_bytes, restore_cache
from .tokenizer import LlamaTokenizer

__all__ = ["Llama"]


class Llama:
    """A GGUF model, as llama-cpp-python's ``Llama`` presents one."""

    def __init__(self, model_path: str, **kwargs: Any) -> None:
        from tensorplug.gguf import GGUFError, GGUFFile

        from ..model import LlamaConfig

        self._options = o = load_options(model_path, kwargs)
        self.model_path = o.model_path
        self.verbose = o.verbose
        self.chat_format = o.chat_format
        self.chat_handler = o.chat_handler
        self.draft_model = o.draft_model
        self.lora_path, self.lora_scale, self.lora_base = o.lora_path, o.lora_scale, o.lora_base
        self.last_n_tokens_size = o.last_n_tokens_size
        self.spm_infill = o.spm_infill
        self.cache: Any = None
        self._seed = o.seed
        if not os.path.exists(o.model_path):
            raise ValueError(f"Model path does not exist: {o.model_path}")
        self._file = GGUFFile(o.model_path)
        self.metadata: dict[str, str] = _metadata(self._file)  # the file's, as llama.cpp's
        if o.kv_overrides:
            try:
                self._file.override(o.kv_overrides)
            except GGUFError as e:
                raise ValueError(f"kv_overrides: {e}") from None
        self._config = cfg = LlamaConfig.from_gguf(self._file, o.rope)
        self._vocab: Vocab = Vocab.from_gguf(self._file)
        self.tokenizer_ = LlamaTokenizer(self._vocab)
        self.n_batch = min(o.n_batch, o.n_ctx or cfg.n_ctx_train)
        self._runner: Any = None
        self._session: Session | None = None
        self._llm: LLM | None = None
        if o.vocab_only:
            return
        self._load(o, cfg)

    def _load(self, o: LoadOptions, cfg: Any) -> None:
        from ..lora import LoraError
        from ..runner import ModelRunner

        n_ctx = o.n_ctx or cfg.n_ctx_train
        try:
            runner = ModelRunner(
                self._file,
                placement=_placement(o, cfg.n_layer, self._file),
                n_ctx=n_ctx,
                n_batch=min(o.step_tokens, n_ctx),
                cache_type=o.type_k,
                cache_type_v=o.type_v,
                use_mmap=o.use_mmap,
                n_threads=o.n_threads,
                rope=o.rope,
                flash_attn=o.flash_attn,
                lora=o.lora,
            )
        except LoraError as e:  # llama-cpp-python's exception, with llama.cpp's reason
            raise ValueError(
                f"Failed to initialize LoRA adapter from lora path: {o.lora_path}: {e}"
            ) from None
        self._runner = runner
        threads = None
        if o.n_threads is not None and o.n_threads_batch not in (None, o.n_threads):
            batch, single = o.n_threads_batch, o.n_threads

            def threads(n_tokens: int) -> None:
                runner.set_n_threads(batch if n_tokens > 1 else single)

        self._session = Session(
            runner,
            n_batch=self.n_batch,
            logits_all=o.logits_all,
            last_n_tokens_size=o.last_n_tokens_size,
            seed=o.seed,
            constraint_for=self._constraint,
            threads=threads,
            draft_model=o.draft_model,
        )
        if self.verbose:
            print(
                f"tensorplug: loaded {Path(self.model_path).name} ({cfg.arch.name}, "
                f"{cfg.n_layer} blocks; {runner.placement.describe()}; n_ctx = {n_ctx})",
                file=sys.stderr,
            )
        if o.use_mlock:
            from ..memory_lock import lock_memory

            why = lock_memory()
            if why is not None:  # llama.cpp warns and runs on
                warnings.warn(why, RuntimeWarning, stacklevel=3)

    # -- what the model is ------------------------------------------------------------------------

    def n_ctx(self) -> int:
        return self._require().n_ctx

    def n_embd(self) -> int:
        return int(self._config.n_embd)

    def n_vocab(self) -> int:
        return int(self._config.n_vocab)

    def token_bos(self) -> int:
        return -1 if self._vocab.bos is None else int(self._vocab.bos)

    def token_eos(self) -> int:
        return -1 if self._vocab.eos is None else int(self._vocab.eos)

    def token_nl(self) -> int:
        ids = self._vocab.encode("\n", add_bos=False)
        return int(ids[-1]) if ids else -1

    def pooling_type(self) -> str:
        return self._options.pooling or self._config.pooling

    # -- the sequence -------------------------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        return self._require().n_tokens

    @n_tokens.setter
    def n_tokens(self, n: int) -> None:
        self._require().truncate(n)

    @property
    def input_ids(self) -> npt.NDArray[np.intc]:
        return self._require().input_ids

    @property
    def scores(self) -> npt.NDArray[np.single]:
        return self._require().scores

    @property
    def _input_ids(self) -> npt.NDArray[np.intc]:
        s = self._require()
        return s.input_ids[: s.n_tokens]

    @property
    def _scores(self) -> npt.NDArray[np.single]:
        s = self._require()
        return s.scores[: s.n_tokens, :]

    @property
    def eval_tokens(self) -> list[int]:
        return self._input_ids.tolist()

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of the UTF-8 ``text``; ``add_bos`` adds what the model asks for
        (BOS where it wants one), ``special`` parses control tokens written in it."""
        return self.tokenizer_.tokenize(text, add_bos, special)

    def detokenize(
        self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None, special: bool = False
    ) -> bytes:
        """The bytes of ``tokens`` (control tokens written only with ``special``)."""
        return self.tokenizer_.detokenize(tokens, prev_tokens, special)

    def tokenizer(self) -> LlamaTokenizer:
        """The vocabulary as llama-cpp-python's tokenizer object."""
        return self.tokenizer_

    def reset(self) -> None:
        """Forget the evaluated tokens (the next prompt is evaluated from the start)."""
        self._require().reset()

    def eval(self, tokens: Sequence[int]) -> None:
        """Evaluate ``tokens`` after the ``n_tokens`` already evaluated."""
        self._require().eval(tokens)

    def set_seed(self, seed: int) -> None:
        self._seed = seed
        self._require().seed = seed

    def set_cache(self, cache: Any) -> None:
        self.cache = cache

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
               typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0,
               frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
               tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_eta: float = 0.1,
               mirostat_tau: float = 5.0, penalize_nl: bool = True,
               logits_processor: Any = None, grammar: Any = None,
               idx: int | None = None) -> int:  # fmt: skip
        """Draw a token from the logits of the last evaluated token (or of ``idx``)."""
        settings = SampleSettings(
            top_k, top_p, min_p, typical_p, temp, repeat_penalty, frequency_penalty,
            presence_penalty, tfs_z, mirostat_mode, mirostat_tau, mirostat_eta, penalize_nl,
            logits_processor, grammar,
        )  # fmt: skip
        session = self._require()
        if session.n_tokens == 0:
            raise ValueError("nothing evaluated yet: call eval(tokens) before sample()")
        return session.sample(settings, idx)

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, typical_p: float = 1.0, temp: float = 0.80,
                 repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                 mirostat_eta: float = 0.1, penalize_nl: bool = True,
                 logits_processor: Any = None, stopping_criteria: Any = None,
                 grammar: Any = None) -> Iterator[int]:  # fmt: skip
        """Tokens sampled after ``tokens``, one at a time, for as long as the caller
        iterates (the cached prefix of ``tokens`` is reused)."""
        settings = SampleSettings(
            top_k, top_p, min_p, typical_p, temp, repeat_penalty, frequency_penalty,
            presence_penalty, tfs_z, mirostat_mode, mirostat_tau, mirostat_eta, penalize_nl,
            logits_processor, grammar,
        )  # fmt: skip
        return self._require().generate(
            tokens, settings, reset=reset, stopping_criteria=stopping_criteria
        )

    # -- completions ---------------------------------------------------------------------------

    def create_completion(self, prompt: str | list[int], suffix: str | None = None,
                          max_tokens: int | None = 16, temperature: float = 0.8,
                          top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
                          logprobs: int | None = None, echo: bool = False,
                          stop: str | list[str] | None = None,
                          frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                          repeat_penalty: float = 1.0, top_k: int = 40, stream: bool = False,
                          seed: int | None = None, tfs_z: float = 1.0,
                          mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                          mirostat_eta: float = 0.1, model: str | None = None,
                          stopping_criteria: Any = None, logits_processor: Any = None,
                          grammar: Any = None,
                          logit_bias: Mapping[Any, float] | None = None,
                          ) -> dict[str, Any] | Iterator[dict[str, Any]]:  # fmt: skip
        """A text completion of ``prompt``: llama-cpp-python's ``text_completion`` dict,
        or with ``stream`` an iterator of its chunks."""
        session = self._require()
        fim = _fim_tokens(self._file) if suffix is not None else None
        tokens = prompt_tokens(self._vocab, prompt, suffix, self.spm_infill, fim)
        settings = SampleSettings(
            top_k, top_p, min_p, typical_p, temperature, repeat_penalty, frequency_penalty,
            presence_penalty, tfs_z, mirostat_mode, mirostat_tau, mirostat_eta, True,
            logits_processor, grammar, _bias(logit_bias, self.n_vocab()),
        )  # fmt: skip
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if self.cache is not None:
            self._from_cache(tokens)
        request = CompletionRequest(
            prompt=prompt,
            prompt_tokens=tokens,
            max_tokens=max_tokens,
            stop=stops,
            logprobs=logprobs,
            echo=echo,
            stream=stream,
            model=model if model is not None else self.model_path,
            seed=self._call_seed(seed),
            stopping_criteria=stopping_criteria,
        )
        chunks = self._cached_after(complete(session, settings, request, self._vocab), tokens)
        if stream:
            return chunks
        (result,) = chunks  # all of it: the prompt cache is written at the end
        return result

    def __call__(self, prompt: str | list[int], *args: Any, **kwargs: Any) -> Any:
        """:meth:`create_completion`."""
        return self.create_completion(prompt, *args, **kwargs)

    def _call_seed(self, seed: int | None) -> int:
        """llama-cpp-python: a call's seed, else one drawn from the model's seed."""
        if seed is not None:
            return seed
        if self._seed == LLAMA_DEFAULT_SEED:
            return random.randint(0, 2**32 - 2)
        return random.Random(self._seed).randint(0, 2**32 - 2)

    # -- chat ---------------------------------------------------------------------------------

    def create_chat_completion(self, messages: list[dict[str, Any]],
                               functions: list[dict[str, Any]] | None = None,
                               function_call: Any = None,
                               tools: list[dict[str, Any]] | None = None,
                               tool_choice: Any = None, temperature: float = 0.2,
                               top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
                               typical_p: float = 1.0, stream: bool = False,
                               stop: str | list[str] | None = None, seed: int | None = None,
                               response_format: Mapping[str, Any] | None = None,
                               max_tokens: int | None = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, tfs_z: float = 1.0,
                               mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                               mirostat_eta: float = 0.1, model: str | None = None,
                               logits_processor: Any = None, grammar: Any = None,
                               logit_bias: Mapping[Any, float] | None = None,
                               logprobs: bool | None = None, top_logprobs: int | None = None,
                               ) -> dict[str, Any] | Iterator[dict[str, Any]]:  # fmt: skip
        """A reply to ``messages``: llama-cpp-python's ``chat.completion`` dict, or with
        ``stream`` an iterator of its chunks. The conversation is rendered by
        ``chat_handler`` if one was given, else by the named ``chat_format``, else by the
        model file's own chat template (with ``tools``, ``tool_choice`` and OpenAI's
        ``response_format``, ``json_schema`` included)."""
        call = dict(locals())
        del call["self"]
        if self.chat_handler is not None:
            return self.chat_handler(llama=self, **call)
        from .chat import answer

        generator = self._chat_generator()
        return answer(
            call,
            layer=self._chat_layer(),
            generator=generator,
            chat_format=self.chat_format,
            metadata=self.metadata,
            tokenizer=self.tokenizer_,
            seed=self._call_seed(None),
        )

    def _chat_layer(self) -> LLM:
        """The server's chat layer over this model's own sequence."""
        if self._llm is None:
            session = self._require()
            template = self._file.get("tokenizer.chat_template")
            self._llm = LLM(
                self._runner,
                DirectGenerator(session, self._vocab),
                model_name=self.model_path,
                chat_template=template if isinstance(template, str) else None,
            )
        return self._llm

    def _chat_generator(self) -> DirectGenerator:
        generator = self._chat_layer().generator
        assert isinstance(generator, DirectGenerator)
        return generator

    # -- embeddings -----------------------------------------------------------------------------

    def embed(self, input: str | list[str], normalize: bool = False, truncate: bool = True,
              return_count: bool = False) -> Any:  # fmt: skip
        """Each text's embedding: pooled as the model (or ``pooling_type``) says, or one
        row per token when the pooling is ``none``; ``normalize`` to unit length."""
        if not self._options.embedding:
            raise RuntimeError(
                "Llama model must be created with embedding=True to call this method"
            )
        session = self._require()
        pooling = self._options.pooling or self._config.pooling
        texts = [input] if isinstance(input, str) else list(input)
        out: list[Any] = []
        total = 0
        for text in texts:
            ids = self.tokenize(text.encode("utf-8"))
            if truncate:
                ids = ids[: self.n_batch]
            if len(ids) > self.n_batch:
                raise ValueError(
                    f"Requested tokens ({len(ids)}) exceed batch size of {self.n_batch}"
                )
            total += len(ids)
            vectors = np.asarray(self._runner.embed(ids, pooling), dtype=np.float32)
            if normalize:
                norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
                vectors = np.where(norms > 0, vectors / np.where(norms > 0, norms, 1), vectors)
            out.append(vectors.tolist())
        session.n_tokens, session.last_logits = 0, None  # embedding cleared the cache
        result = out[0] if isinstance(input, str) else out
        return (result, total) if return_count else result

    def create_embedding(self, input: str | list[str], model: str | None = None) -> dict[str, Any]:
        """llama-cpp-python's embeddings response."""
        vectors, total = self.embed(input if isinstance(input, list) else [input],
                                    return_count=True)  # fmt: skip
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)
            ],
            "model": model if model is not None else self.model_path,
            "usage": {"prompt_tokens": total, "total_tokens": total},
        }

    # -- state ----------------------------------------------------------------------------------

    def save_state(self) -> LlamaState:
        session = self._require()
        data = cache_bytes(self._runner, session.n_tokens)
        return LlamaState(
            input_ids=session.input_ids.copy(),
            scores=session.scores[: session.n_tokens].copy(),
            n_tokens=session.n_tokens,
            llama_state=data,
            llama_state_size=len(data),
            seed=self._seed,
        )

    def load_state(self, state: LlamaState) -> None:
        session = self._require()
        restore_cache(self._runner, state.llama_state, state.n_tokens)
        session.input_ids[:] = state.input_ids
        rows = min(state.n_tokens, session.scores.shape[0])
        session.scores[:rows] = state.scores[:rows]
        session.scores[rows:] = 0
        session.n_tokens = state.n_tokens
        session.last_logits = None  # the next generation evaluates its last token again
        self._seed = session.seed = state.seed

    def _from_cache(self, tokens: list[int]) -> None:
        try:
            state = self.cache[tokens]
        except KeyError:
            return
        held = common_prefix(self._input_ids.tolist(), tokens)
        if common_prefix(state.input_ids[: state.n_tokens].tolist(), tokens) > held:
            self.load_state(state)

    def _cached_after(
        self, chunks: Iterator[dict[str, Any]], tokens: list[int]
    ) -> Iterator[dict[str, Any]]:
        yield from chunks
        if self.cache is not None:
            self.cache[self._input_ids.tolist()] = self.save_state()

    # -- the rest -------------------------------------------------------------------------------

    @staticmethod
    def logits_to_logprobs(logits: Any, axis: int = -1) -> npt.NDArray[np.single]:
        return logits_to_logprobs(np.asarray(logits), axis)

    @staticmethod
    def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
        return common_prefix(a, b)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None, **kwargs: Any) -> Llama:
        """Download ``filename`` (a name or a glob pattern) of the Hugging Face repository
        ``repo_id`` through ``huggingface_hub`` (or find it in its cache) and load it."""
        from ..hub import download

        keys = ("additional_files", "local_dir", "local_dir_use_symlinks", "cache_dir")
        hub = {k: kwargs.pop(k) for k in keys if k in kwargs}
        return cls(model_path=download(repo_id, filename, **hub), **kwargs)

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown: nothing to tell
            self.close()

    def _require(self) -> Session:
        if self._session is None:
            if self._options.vocab_only:
                raise ValueError(
                    "this model was loaded with vocab_only=True: only tokenize, detokenize "
                    "and the vocabulary's methods work"
                )
            raise ValueError("this model is closed")
        if self._runner is None:
            raise ValueError("this model is closed")
        return self._session

    def _constraint(self, grammar: Any) -> Any:
        """A grammar (LlamaGrammar), a ``response_format`` dict, or a constraint."""
        if hasattr(grammar, "allowed") and hasattr(grammar, "accept"):
            return grammar
        rf = grammar if isinstance(grammar, Mapping) else grammar.response_format()
        try:
            return constraint_for(self._vocab, dict(rf), self.n_vocab())
        except ImportError as e:
            raise ValueError(f"grammars need llguidance ({e})") from None

    def __getstate__(self) -> dict[str, Any]:
        return {"model_path": self.model_path, **_given(self._options)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]


def _placement(o: LoadOptions, n_layer: int, file: Any) -> Any:
    """Where the blocks go, as llama.cpp places them: ``n_gpu_layers`` of them (-1: all,
    with the output layer) on the accelerators, counted best first (``main_gpu`` and
    ``tensor_split`` index them). ``split_mode`` 0 (none): all on ``main_gpu``; 1
    (layer, the default): consecutive runs over the accelerators by ``tensor_split``
    (default: by their free memory); 2 (row): every block's rows shared over them (a
    meta device: :mod:`..row_split`), which needs every block offloaded."""
    from ..placement import Placement, accelerators

    gpus = accelerators()
    n = n_layer + 1 if o.n_gpu_layers < 0 else o.n_gpu_layers
    if gpus and o.main_gpu >= len(gpus):
        names = ", ".join(f"{i}: {d.name}" for i, d in enumerate(gpus))
        raise ValueError(f"main_gpu={o.main_gpu}: there are {len(gpus)} accelerators ({names})")
    if not gpus or n == 0:
        return Placement.offload(n_layer, 0)
    if o.split_mode == LLAMA_SPLIT_MODE_NONE or len(gpus) == 1:
        return Placement.offload(n_layer, n, gpu=gpus[o.main_gpu])
    shares = _shares(o.tensor_split, gpus)
    used = [(g, s) for g, s in zip(gpus, shares, strict=True) if s > 0]
    if o.split_mode == LLAMA_SPLIT_MODE_ROW:
        if n <= n_layer:
            raise ValueError(
                "split_mode=2 (row) shares every block's rows over the accelerators: set "
                f"n_gpu_layers=-1 (got {o.n_gpu_layers}), or use split_mode=1 (layer)"
            )
        if len(used) == 1:
            return Placement.offload(n_layer, n, gpu=used[0][0])
        from ..row_split import row_split_device

        meta = row_split_device(file, [g for g, _ in used], [s for _, s in used])
        return Placement.on(meta, n_layer)
    return Placement.offload_split(n_layer, n, [g for g, _ in used], [s for _, s in used])


def _shares(split: tuple[float, ...] | None, gpus: Sequence[Any]) -> list[float]:
    """Each accelerator's share: ``tensor_split`` (missing entries 0), or where it gives
    none, each one's free memory, as llama.cpp splits by default."""
    if split is not None and any(split[: len(gpus)]):
        return [split[i] if i < len(split) else 0.0 for i in range(len(gpus))]
    free = [float(d.memory()[0]) for d in gpus]
    return free if any(free) else [1.0] * len(gpus)


def _fim_tokens(file: Any) -> tuple[int, int, int] | None:
    ids = []
    for new, old in (("fim_pre", "prefix"), ("fim_suf", "suffix"), ("fim_mid", "middle")):
        value = file.get(
            f"tokenizer.ggml.{new}_token_id", file.get(f"tokenizer.ggml.{old}_token_id")
        )
        if not isinstance(value, int) or value < 0:
            return None
        ids.append(value)
    return ids[0], ids[1], ids[2]


def _bias(logit_bias: Mapping[Any, float] | None, n_vocab: int) -> dict[int, float] | None:
    if not logit_bias:
        return None
    out = {}
    for key, value in logit_bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias keys are token ids, got {key!r}") from None
        if not 0 <= token < n_vocab:
            raise ValueError(f"logit_bias names token {token}, outside 0..{n_vocab - 1}")
        out[token] = float(value)
    return out


def _metadata(file: Any) -> dict[str, str]:
    """The file's metadata as llama-cpp-python gives it: every key, its value as text
    (arrays left out, as llama.cpp leaves them out of ``llama_model_meta``)."""
    out = {}
    for key in file.keys():  # noqa: SIM118 - a GGUFFile is not a mapping
        if file.length(key) is not None:
            continue
        value = file.get(key)
        out[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def _given(o: LoadOptions) -> dict[str, Any]:
    """The keywords that load ``o`` again (pickling a Llama loads the model anew)."""
    return {
        "n_gpu_layers": o.n_gpu_layers, "split_mode": o.split_mode, "main_gpu": o.main_gpu,
        "tensor_split": list(o.tensor_split) if o.tensor_split else None,
        "vocab_only": o.vocab_only, "use_mmap": o.use_mmap, "seed": o.seed,
        "n_ctx": o.n_ctx, "n_batch": o.n_batch, "n_ubatch": o.n_ubatch,
        "n_threads": o.n_threads, "n_threads_batch": o.n_threads_batch,
        "logits_all": o.logits_all, "embedding": o.embedding, "flash_attn": o.flash_attn,
        "last_n_tokens_size": o.last_n_tokens_size, "chat_format": o.chat_format,
        "chat_handler": o.chat_handler, "draft_model": o.draft_model,
        "lora_path": o.lora_path, "lora_scale": o.lora_scale, "lora_base": o.lora_base,
        "use_mlock": o.use_mlock,
        "type_k": int(o.type_k),
        "type_v": int(o.type_v), "spm_infill": o.spm_infill, "verbose": o.verbose,
    }  # fmt: skip
