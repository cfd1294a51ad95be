"""``ModelRunner.decode``: several sequences in one batch, each as if it ran alone.

The tiny model on the CPU. A sequence's logits must not depend on which other
sequences share its steps (their tokens are masked out of its attention) nor on which
cache rows its tokens landed in; and a shifted sequence (``seq_add``) must read as a
fresh evaluation at its new positions once its K rows are re-roped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tensorplug.errors import RunError
from tensorplug_llm.batch import Batch, BatchBuilder
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ContextFullError, ModelRunner
from tensorplug_llm.tiny import write_tiny_llama

A = [1, 259, 288, 300, 270, 265, 280, 290]
B = [1, 300, 310, 270, 275, 285]
SEED = 3


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("decode")
    return {
        "q8_0": write_tiny_llama(folder / "tiny-q8_0.gguf", "q8_0", SEED),
        "f32": write_tiny_llama(folder / "tiny-f32.gguf", "f32", SEED),
        "yarn": write_tiny_llama(
            folder / "tiny-yarn.gguf", "f32", SEED, rope_scaling=("yarn", 4.0)
        ),
        # rope's magnitude from the file (as Phi-3's LongRoPE files have) on top of YaRN's
        "yarn-attn": write_tiny_llama(
            folder / "tiny-yarn-attn.gguf",
            "f32",
            SEED,
            rope_scaling=("yarn", 4.0),
            metadata={"llama.rope.scaling.attn_factor": 1.5},
        ),
    }


@pytest.fixture
def opened() -> Iterator[list[ModelRunner]]:
    models: list[ModelRunner] = []
    yield models
    for m in models:
        m.close()


def _llama(opened: list[ModelRunner], path: Path, **kw: object) -> ModelRunner:
    m = ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_threads=1, **kw)  # type: ignore[arg-type]
    opened.append(m)
    return m


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("kind", ["q8_0", "f32"])
def test_interleaved_sequences_match_each_alone(
    files: dict[str, Path], opened: list[ModelRunner], kind: str
) -> None:
    """A and B's prompts interleaved token by token in one batch (so their cells
    alternate), then two decode steps of both together: every logit row equals the
    row of the sequence evaluated alone, bit for bit with quantized weights (the CPU's
    repacked integer kernels compute each token's row on its own). F32 weights go
    through BLAS (``numpy.matmul``), whose blocking, and so rounding, depends on the
    number of rows: within 2e-5 of the largest logit there (measured 5e-6)."""
    m = _llama(opened, files[kind], kv_pad=16)
    alone = {}
    for name, toks in (("A", A), ("B", B)):
        m.reset()
        rows = [m.decode(Batch.single(toks, 0, all_logits=True))]
        for step in (300, 301):
            rows.append(m.decode(Batch.single([step], m.n_past)))
        alone[name] = np.concatenate(rows)
    m.reset()
    b = BatchBuilder()
    for i in range(max(len(A), len(B))):
        for seq, toks in ((0, A), (1, B)):
            if i < len(toks):
                b.add(toks[i], i, (seq,), logits=True)
    out = m.decode(b.build())
    got_a = [out[[i for i, s in enumerate(b.seq_ids) if s == (0,)]]]
    got_b = [out[[i for i, s in enumerate(b.seq_ids) if s == (1,)]]]
    assert m.kv.pos[:4].tolist() == [0, 0, 1, 1]  # the sequences' cells alternate
    for step in (300, 301):
        both = m.decode(
            Batch(
                np.array([step, step]),
                np.array([m.kv.seq_pos_max(0) + 1, m.kv.seq_pos_max(1) + 1]),
                ((0,), (1,)),
                np.array([True, True]),
            )
        )
        got_a.append(both[:1])
        got_b.append(both[1:])
    for got, want in ((got_a, alone["A"]), (got_b, alone["B"])):
        if kind == "q8_0":
            np.testing.assert_array_equal(np.concatenate(got), want)
        else:
            assert _rel(np.concatenate(got), want) <= 2e-5


def test_a_forked_prefix_is_shared_not_recomputed(
    files: dict[str, Path], opened: list[ModelRunner]
) -> None:
    """seq_cp gives sequence 1 sequence 0's prompt cells; its continuation reads them
    and equals sequence 0's own continuation, with no cell added for the prefix."""
    m = _llama(opened, files["q8_0"], kv_pad=16)
    m.decode(Batch.single(A, 0))
    used = m.kv.n_used
    m.kv.seq_cp(0, 1)
    assert m.kv.n_used == used
    both = m.decode(
        Batch(np.array([300, 300]), np.array([len(A)] * 2), ((0,), (1,)), np.array([True, True]))
    )
    np.testing.assert_array_equal(both[0], both[1])
    assert m.kv.n_used == used + 2


@pytest.mark.parametrize(
    ("kind", "cache", "tol"),
    [("f32", "f32", 2e-6), ("f32", "f16", 2e-3), ("yarn", "f32", 2e-6), ("yarn-attn", "f32", 2e-6)],
)
def test_shifted_sequence_reads_as_fresh_at_its_new_positions(
    files: dict[str, Path], opened: list[ModelRunner], kind: str, cache: str, tol: float
) -> None:
    """Positions 0..7 moved to 5..12 (seq_add): the K rows are re-roped by 5, so the
    next token at 13 gets the logits of the same tokens evaluated at 5..12. Without
    the re-rope the logits are far off (the test can tell). The re-rope only rotates:
    the rows keep the magnitude the rope gave them (the file's attn_factor)."""
    m = _llama(opened, files[kind], cache_type=cache, kv_pad=16)
    fresh_prompt = m.decode(Batch.single(A, 5))
    fresh = m.decode(Batch.single([300], 5 + len(A)))
    m.reset()
    m.decode(Batch.single(A, 0))
    m.kv.seq_add(0, 0, None, 5)
    assert m.n_past == 5 + len(A)
    shifted = m.decode(Batch.single([300], m.n_past))
    assert _rel(shifted, fresh) <= tol
    m.reset()
    m.decode(Batch.single(A, 0))
    m.kv.seq_add(0, 0, None, 5)
    m.kv.take_shift()  # forget the re-rope
    stale = m.decode(Batch.single([300], m.n_past))
    assert _rel(stale, fresh) > 50 * tol
    assert fresh_prompt.shape == (1, m.config.n_vocab)


def test_positions_must_continue_a_sequence(
    files: dict[str, Path], opened: list[ModelRunner]
) -> None:
    m = _llama(opened, files["q8_0"], n_ctx=16, kv_pad=16)
    m.decode(Batch.single(A, 0))
    with pytest.raises(RunError, match="sequence 0 already holds positions up to 7"):
        m.decode(Batch.single([5], 3))
    m.decode(Batch.single(B, 0, seq=1))
    with pytest.raises(ContextFullError, match="2 free cells of n_ctx = 16 and a step needs 3"):
        m.decode(Batch.single([5, 6, 7], 0, seq=2))
    assert m.kv.n_used == len(A) + len(B)  # a refused batch wrote nothing
    m.n_past = 3
    assert m.kv.n_used == 3 + len(B) and m.kv.seq_pos_max(1) == len(B) - 1
    with pytest.raises(RunError, match="n_past can only go back"):
        m.n_past = 4


def test_graph_shapes_repeat_without_rebuilding(
    files: dict[str, Path], opened: list[ModelRunner]
) -> None:
    """Decode steps of two sequences reuse one graph per (tokens, rows, outputs)."""
    m = _llama(opened, files["q8_0"], kv_pad=64)
    m.decode(Batch.single(A, 0))
    m.decode(Batch.single(B, 0, seq=1))
    built = m.timings.graphs_built
    for i in range(6):
        m.decode(
            Batch(
                np.array([300 + i] * 2),
                np.array([len(A) + i, len(B) + i]),
                ((0,), (1,)),
                np.array([True, True]),
            )
        )
    assert m.timings.graphs_built == built + 1


def test_cells_out_of_position_order_change_nothing(
    files: dict[str, Path], opened: list[ModelRunner]
) -> None:
    """Sequence 0's prompt lands after another sequence's cells; once those are freed,
    its next tokens take the lower cells: its cells are no longer in position order.
    The logits equal a run in cells 0, 1, 2, ... bit for bit on the CPU."""
    m = _llama(opened, files["q8_0"], kv_pad=32)
    steps = [300, 301, 302, 303, 304]
    want = [m.decode(Batch.single(A, 0))]
    want += [m.decode(Batch.single([t], len(A) + i)) for i, t in enumerate(steps)]
    m.reset()
    m.decode(Batch.single(list(range(10, 20)), 0, seq=1))
    got = [m.decode(Batch.single(A, 0))]
    m.kv.seq_rm(1)
    got += [m.decode(Batch.single([t], len(A) + i)) for i, t in enumerate(steps)]
    assert m.kv.pos[:5].tolist() == [8, 9, 10, 11, 12]  # positions 8.. before 0..7
    np.testing.assert_array_equal(np.concatenate(got), np.concatenate(want))


@pytest.mark.parametrize("flash_attn", [False, True])
def test_a_step_wider_than_its_cells_gives_the_same_bits(
    files: dict[str, Path], opened: list[ModelRunner], flash_attn: bool
) -> None:
    """A step's width (``n_kv``) only rounds up the cells it reads: at a width of 256
    for 30 cells the logits equal those at 32, bit for bit (the CPU's attention stops
    at the last column a row sees, and its walk of the position order stops before
    the cells no row sees), with the cells out of position order too."""
    steps = [300, 301, 302, 303, 304]
    runs = []
    for kv_pad in (16, 256):
        m = _llama(opened, files["q8_0"], kv_pad=kv_pad, n_ctx=256, flash_attn=flash_attn,
                   batch_invariant=True)  # fmt: skip
        m.decode(Batch.single(list(range(10, 20)), 0, seq=1))
        got = [m.decode(Batch.single(A, 0))]
        m.kv.seq_rm(1)
        got += [m.decode(Batch.single([t], len(A) + i)) for i, t in enumerate(steps)]
        runs.append(np.concatenate(got))
    np.testing.assert_array_equal(runs[0], runs[1])


def test_padded_steps_give_the_real_rows_of_unpadded_ones(
    files: dict[str, Path], opened: list[ModelRunner]
) -> None:
    """``decode(pad=True)`` runs a 21-token step at 24 rows (:meth:`ModelRunner.step_rows`),
    beside another sequence's cells: the 3 padding rows write only free cells and see
    only their own, so every real logit row is the unpadded step's, bit for bit with
    the repacked Q8_0 kernels; nothing is recorded for them in the cells, and the
    other sequence, decoded after, is unchanged too. Steps of 17..24 tokens on an
    empty cache then share one graph."""
    m = _llama(opened, files["q8_0"], kv_pad=16, n_ctx=128)
    rng = np.random.default_rng(5)
    prompt = rng.integers(3, 320, size=21).tolist()
    results = []
    for pad in (False, True):
        m.reset()
        m.decode(Batch.single(B, 0, seq=1), pad=pad)
        first = m.decode(Batch.single(prompt, 0, all_logits=True), pad=pad)
        assert m.kv.n_used == len(B) + len(prompt)  # the padding held on to no cell
        nxt = m.decode(Batch(np.array([7, 9]), np.array([len(prompt), len(B)]),
                             ((0,), (1,)), np.array([True, True])), pad=pad)  # fmt: skip
        results.append((first, nxt))
    assert [m.step_rows(n) for n in (3, 5, 13, 21, 33, 100)] == [3, 8, 16, 24, 48, 128]
    np.testing.assert_array_equal(results[1][0], results[0][0])
    np.testing.assert_array_equal(results[1][1], results[0][1])
    # steps whose rounded outputs are all their rows (no out_ids): the flagged rows
    for flags in ([True, True, True, True, False, True], [False, False, True]):
        got = []
        for pad in (False, True):
            m.reset()
            toks = prompt[: len(flags)]
            got.append(m.decode(Batch(np.array(toks), np.arange(len(toks)),
                                      ((0,),) * len(toks), np.array(flags)), pad=pad))  # fmt: skip
        np.testing.assert_array_equal(got[1], got[0])
    built = []
    for n in (17, 20, 24):
        m.reset()
        out = m.decode(Batch.single(prompt[:1] * n, 0), pad=True)
        assert out.shape == (1, m.config.n_vocab)
        built.append(m.timings.graphs_built)
    assert built[0] == built[-1]  # the 24-row graph of the first
