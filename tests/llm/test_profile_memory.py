"""benchmarks/profile_memory.py: the stages it reports, in order, with real figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "profile_memory.py"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_tensorplug_worker_reports_every_stage_in_order(tmp_path: Path) -> None:
    from tensorplug_llm.tiny import write_tiny_llama

    path = write_tiny_llama(tmp_path / "tiny.gguf", "q8_0", n_embd=64, n_ff=128, n_layer=2,
                            n_head=4, n_head_kv=2, n_vocab=320)  # fmt: skip
    cmd = [sys.executable, str(SCRIPT), "--worker", "tensorplug", "--model", str(path),
           "--threads", "1", "--prompt", "72", "--gen", "2", "--batch", "96"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    stages = json.loads(done.stdout.strip().splitlines()[-1])
    labels = [label for label, _ in stages]
    # the worker patches the loader to mark each stage: they all ran, in this order (the
    # shared scheduler's buffers are reserved for batches of more than 64 tokens only)
    order = ["interpreter", "import numpy", "import numba (llvmlite)", "plugin discovery",
             "GGUF opened (metadata)", "vocabulary", "weights copied (repacked)",
             "weights mapped", "KV cache", "compute buffers reserved",
             "warm-up (numba cache loads)", "first prompt (72 tokens)",
             "generation (2 tokens)"]  # fmt: skip
    assert [label for label in labels if label in order] == [
        label for label in order for _ in range(labels.count(label))
    ]
    assert set(order) <= set(labels)
    peaks = [mem["VmHWM"] for _, mem in stages]
    assert peaks == sorted(peaks) and peaks[0] > 5  # a peak never falls; an interpreter
    for _, mem in stages:
        assert mem["VmRSS"] <= mem["VmHWM"] + 0.01
        assert abs(mem["RssAnon"] + mem["RssFile"] - mem["VmRSS"]) < 1.0  # (+ shmem: ~0)
    by_label = dict(stages)
    assert by_label["import numba (llvmlite)"]["VmRSS"] > by_label["import numpy"]["VmRSS"]
