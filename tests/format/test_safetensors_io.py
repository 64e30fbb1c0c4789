"""The streaming writer produces the reference implementation's bytes; the parser is strict."""

from __future__ import annotations

import math

import pytest
import safetensors.torch
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from statekeeper.format.safetensors_io import layout, parse, stream
from statekeeper.format.torch_dtypes import DTYPE_CODES

DTYPES = sorted(DTYPE_CODES, key=str)


def _tensor(shape: list[int], dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(
        0, 255, (math.prod(shape) * dtype.itemsize,), generator=gen, dtype=torch.uint8
    )
    if dtype == torch.bool:
        return (raw % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape) if raw.numel() else torch.empty(shape, dtype=dtype)


states = st.dictionaries(
    st.text(min_size=1, max_size=8),
    st.tuples(st.lists(st.integers(0, 5), max_size=3), st.sampled_from(DTYPES), st.integers(0, 99)),
    max_size=8,
)


@settings(max_examples=80, deadline=None)
@given(states)
def test_bytes_equal_the_reference_implementation(
    spec: dict[str, tuple[list[int], torch.dtype, int]],
) -> None:
    tensors = {name: _tensor(shape, dtype, seed) for name, (shape, dtype, seed) in spec.items()}
    ours = b"".join(bytes(c) for c in stream(tensors, layout(tensors)))
    assert ours == safetensors.torch.save(tensors)
    assert len(ours) == layout(tensors).size
    back = parse(bytearray(ours))
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape
        assert torch.equal(
            back[name].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)
        )


def test_large_tensors_are_written_from_their_own_memory() -> None:
    big = torch.zeros(1 << 19)  # 2 MiB: above the staging threshold
    pieces = list(
        stream({"big": big, "small": torch.ones(3)}, layout({"big": big, "small": torch.ones(3)}))
    )
    assert any(isinstance(p, memoryview) and p.nbytes == big.numel() * 4 for p in pieces)


def test_parsed_tensors_are_views_of_the_buffer() -> None:
    data = bytearray(safetensors.torch.save({"a": torch.arange(4.0)}))
    a = parse(data)["a"]
    data[-4:] = torch.tensor([9.0]).numpy().tobytes()
    assert a[3] == 9.0


@pytest.mark.parametrize(
    "edit",
    [
        lambda b: b[:7],
        lambda b: (10**9).to_bytes(8, "little") + b[8:],
        lambda b: b[:8] + b"[" + b[9:],
        lambda b: b + b"\x00",
        lambda b: b.replace(b'"F32"', b'"F16"'),
        lambda b: b.replace(b'"F32"', b'"XYZ"'),
        lambda b: b.replace(b"[0,16]", b"[0,12]"),
    ],
)
def test_malformed_files_are_value_errors(edit: object) -> None:
    good = safetensors.torch.save({"a": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match=r"header|offsets|trailing|tensor"):
        parse(bytearray(edit(good)))


def test_the_torch_free_dtype_table_agrees_with_torch() -> None:
    from statekeeper.format.dtypes import CODE_OF, ITEMSIZE, dtype_name
    from statekeeper.format.torch_dtypes import DTYPE_CODES

    assert {dtype_name(d): code for d, code in DTYPE_CODES.items()} == CODE_OF
    assert {dtype_name(d): d.itemsize for d in DTYPE_CODES} == ITEMSIZE
