"""Streaming safetensors: write tensors straight from their memory, read without copies.

Written here rather than through ``safetensors.torch.save`` because that builds the whole
serialized file in memory (a second copy of every shard) and ``save_file`` cannot checksum
while writing; ``bench/io.py`` measures the difference. The bytes are exactly those of the
safetensors reference implementation (tested byte for byte against it and the golden
files):

- 8 bytes: little-endian length ``N`` of the JSON header;
- ``N`` bytes: compact JSON ``{"name":{"dtype":..,"shape":[..],"data_offsets":[b,e]},..}``
  (``__metadata__`` first when present), padded with spaces to a multiple of 8;
- the data: tensors ordered by dtype (widest alignment first, in the reference's dtype
  order), then by name, each as its raw little-endian bytes.

Reading parses the header strictly (:func:`~statekeeper.format.safetensors_header.read_header`,
the one header reader) and returns tensors that are zero-copy views of the file's buffer.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from json.encoder import encode_basestring

import torch

from statekeeper.format.dtypes import CODE_RANK
from statekeeper.format.safetensors_header import Header, read_header
from statekeeper.format.torch_dtypes import DTYPE_CODES, DTYPE_OF_CODE

__all__ = ["ShardLayout", "layout", "parse", "stream"]

_DIRECT = 1 << 20  # tensors this large are written from their own memory, not staged
STAGING = 8 << 20  # small tensors are coalesced into writes of this size
_PLAIN = (torch.Tensor, torch.nn.Parameter)


@dataclass(frozen=True)
class ShardLayout:
    """The header bytes and the tensors in file order, with the file's total size."""

    header: bytes
    order: tuple[str, ...]
    size: int


def layout(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> ShardLayout:
    """Where every tensor goes in the file, and the header that says so."""
    order = sorted(tensors, key=lambda n: (CODE_RANK[DTYPE_CODES[tensors[n].dtype]], n.encode()))
    if metadata:
        return _layout_with_metadata(tensors, order, metadata)
    # each entry formatted as json.dumps(..., ensure_ascii=False, separators=(",", ":")) would
    # (names through json's own escaper): 20 -> 12 ms for 3,304 tensors, part of every save
    # (bench/io.py, durable save rows); tests/format checks the bytes against the reference
    enc = encode_basestring
    parts = []
    offset = 0
    for name in order:
        t = tensors[name]
        end = offset + t.nbytes
        parts.append(
            f'{enc(name)}:{{"dtype":"{DTYPE_CODES[t.dtype]}",'
            f'"shape":[{",".join(map(str, t.shape))}],"data_offsets":[{offset},{end}]}}'
        )
        offset = end
    return _shard_layout(("{" + ",".join(parts) + "}").encode(), order, offset)


def _layout_with_metadata(
    tensors: dict[str, torch.Tensor], order: list[str], metadata: dict[str, str]
) -> ShardLayout:
    entries: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for name in order:
        t = tensors[name]
        end = offset + t.nbytes
        entries[name] = {
            "dtype": DTYPE_CODES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, end],
        }
        offset = end
    text = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode()
    return _shard_layout(text, order, offset)


def _shard_layout(text: bytes, order: list[str], data_size: int) -> ShardLayout:
    text += b" " * (-len(text) % 8)
    header = struct.pack("<Q", len(text)) + text
    return ShardLayout(header, tuple(order), len(header) + data_size)


def _raw(t: torch.Tensor) -> memoryview:
    """The tensor's bytes as a buffer (a copy only if it is not contiguous on the CPU)."""
    flat = t.detach().to("cpu").resolve_conj().resolve_neg().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]


def _plain_cpu(t: torch.Tensor) -> bool:
    """Whether ``t``'s bytes are exactly its ``numel * itemsize`` bytes at ``data_ptr()``."""
    return (
        type(t) in _PLAIN and t.is_cpu and t.is_contiguous() and not t.is_conj() and not t.is_neg()
    )


def stream(tensors: dict[str, torch.Tensor], shard: ShardLayout) -> Iterator[memoryview | bytes]:
    """The file's bytes in large pieces: big tensors from their own memory, small ones staged.

    Small tensors are gathered in one reused buffer: each piece must be consumed (written)
    before the next is requested, as ``Transaction.write_chunks`` does.
    """
    yield shard.header
    buffer = bytearray(STAGING)
    view = memoryview(buffer)
    address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    fill = 0
    for name in shard.order:
        t = tensors[name]
        size = t.nbytes
        if size == 0:
            continue
        if size >= _DIRECT:
            if fill:
                yield view[:fill]
                fill = 0
            yield _raw(t)
            continue
        if fill + size > STAGING:
            yield view[:fill]
            fill = 0
        if _plain_cpu(t):  # one memmove, not 7 tensor calls: stream() of bench/io.py's state
            ctypes.memmove(address + fill, t.data_ptr(), size)  # 48 -> 19 ms (3,000 small ones)
        else:
            view[fill : fill + size] = _raw(t)
        fill += size
    if fill:
        yield view[:fill]


def parse(
    data: bytes | bytearray | memoryview | mmap.mmap, header: Header | None = None
) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file held in ``data`` (views when ``data`` is writable).

    Raises ``FormatError`` on anything that is not a well-formed file (the header is checked
    whole by :func:`~statekeeper.format.safetensors_header.read_header` first, unless the
    caller passes the ``header`` it already read from ``data``).
    """
    buf = memoryview(data)
    if header is None:
        header = read_header(buf)
    start = header.start
    out: dict[str, torch.Tensor] = {}
    writable = not buf.readonly
    frombuffer = torch.frombuffer
    for name, e in header.entries.items():
        dtype = DTYPE_OF_CODE[e.code]
        if e.numel == 0:
            out[name] = torch.empty(e.shape, dtype=dtype, device="cpu")
        elif writable:
            flat = frombuffer(data, dtype=dtype, offset=start + e.begin, count=e.numel)
            # no view for 1-D tensors: ~12 ms less per 3,000 vectors (bench/io.py, load rows)
            out[name] = flat if len(e.shape) == 1 else flat.view(e.shape)
        else:
            flat = frombuffer(bytearray(buf[start + e.begin : start + e.end]), dtype=dtype)
            out[name] = flat if len(e.shape) == 1 else flat.view(e.shape)
    return out
