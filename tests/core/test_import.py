"""``import tensorplug`` must stay cheap: no plugin, no GPU library, no discovery."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("tensorplug_", "cupy", "pyopencl", "Metal", "objc", "gguf", "numba", "torch")


def test_import_loads_no_plugin_or_gpu_library() -> None:
    code = "import sys, tensorplug\nprint('\\n'.join(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        check=True,
    )
    loaded = out.stdout.split()
    offenders = [m for m in loaded if m.startswith(HEAVY)]
    assert offenders == []
    # -X importtime lists every module imported; the same check on its own report
    assert not any(f"| {h}" in line for line in out.stderr.splitlines() for h in HEAVY)


def test_the_application_package_loads_its_modules_on_first_use() -> None:
    """``tensorplug`` imports tensorplug_llm (for its commands) every time it starts: the
    package itself must import none of the runner, tokenizers or regex until asked."""
    code = (
        "import sys, tensorplug_llm as app\n"
        "before = sorted(m for m in sys.modules if m.startswith(('tensorplug_llm.', 'regex')))\n"
        "runner = app.ModelRunner\n"
        "from tensorplug_llm.runner import ModelRunner\n"
        "print(before, runner is ModelRunner, 'ModelRunner' in dir(app), 'runner' in vars(app))\n"
        "from tensorplug_llm.highlevel.llama import Llama\n"
        "print(app.Llama is Llama)\n"
        "try:\n"
        "    app.NoSuchName\n"
        "except AttributeError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "[] True True True",
        "True",
        "module 'tensorplug_llm' has no attribute 'NoSuchName'",
    ]


def test_regex_is_imported_by_the_first_bpe_text_not_by_a_model(tmp_path: Path) -> None:
    """``regex`` (7 ms to import) cuts BPE text into words; a model whose tokenizer is
    SentencePiece's (Llama 2, Gemma) loads and tokenizes without it."""
    code = (
        "import sys\n"
        "from tensorplug.gguf import GGUFFile\n"
        "from tensorplug_llm.tiny import write_tiny_llama\n"
        "from tensorplug_llm.tokenizer import Vocab\n"
        "from tensorplug_llm.tokenizer.pretokenize import pre_tokenizer\n"
        f"path = write_tiny_llama({str(tmp_path / 'spm.gguf')!r})\n"
        "vocab = Vocab.from_gguf(GGUFFile(path))\n"
        "ids = vocab.encode('hello world')\n"
        "print('regex' in sys.modules, len(ids) > 0)\n"
        "print(pre_tokenizer('default').split('hello world!'), 'regex' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["False True", "['hello', ' world', '!'] True"]
