"""Type geometry must match ggml / GGUF exactly, or GGUF weights could not be used as-is."""

from __future__ import annotations

import gguf
import pytest

import tensorplug as tp
from tensorplug import Type


@pytest.mark.parametrize("t", list(Type))
def test_type_ids_and_block_geometry_match_gguf(t: Type) -> None:
    gt = gguf.GGMLQuantizationType(int(t))
    assert gt.name == t.name
    assert gguf.GGML_QUANT_SIZES[gt] == (t.block_size, t.type_size)


def test_row_size_and_quantized_flags() -> None:
    assert tp.row_size(Type.F32, 10) == 40
    assert tp.row_size(Type.BF16, 3) == 6
    assert tp.row_size(Type.Q8_0, 64) == 68
    assert tp.row_size(Type.Q4_0, 96) == 54
    assert tp.row_size(Type.Q5_1, 32) == 24
    assert Type.Q4_1.is_quantized and not Type.F16.is_quantized
    assert Type.I64.is_integer and Type.BF16.is_float


def test_row_size_refuses_partial_blocks() -> None:
    with pytest.raises(tp.ShapeError, match="multiple of 32"):
        tp.row_size(Type.Q4_0, 33)


def test_parse_accepts_names_ids_and_reports_unknown() -> None:
    assert Type.parse("q8_0") is Type.Q8_0
    assert Type.parse(30) is Type.BF16
    assert Type.parse(Type.F16) is Type.F16
    with pytest.raises(tp.TypeMismatchError, match="unknown tensor type 'iq2_xxs'.*Q8_0.*Q6_K"):
        Type.parse("iq2_xxs")
    with pytest.raises(tp.TypeMismatchError, match="unknown tensor type 99; known types are F32"):
        Type.parse(99)
