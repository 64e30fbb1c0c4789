"""Decoding tagged JSON (:mod:`statekeeper.format.values`) back into values: only the types
that module lists are ever constructed, so a manifest cannot run code."""

from __future__ import annotations

import base64
import binascii
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from statekeeper.format.dtypes import dtype_from_name
from statekeeper.format.jsondoc import MAX_DEPTH
from statekeeper.format.malformed import FormatError
from statekeeper.format.values import _HEX, _TAGS, Json, RefHook, _too_deep, join_path

if TYPE_CHECKING:
    import torch

__all__ = ["decode_value"]


def _dtype_by_name(name: str, path: str) -> torch.dtype:
    try:
        return dtype_from_name(name)
    except FormatError:  # its message ("unknown dtype") is this one's, without the path
        raise FormatError(f"{path}: unknown torch dtype {name!r}", key=path) from None


def decode_value(obj: Json, path: str, on_ref: RefHook, depth: int = 0) -> Any:
    """Invert :func:`encode_value`; ``on_ref(tag, name)`` supplies tensors and arrays.

    Raises :class:`FormatError` (with the key path) on anything :func:`encode_value` cannot produce,
    nesting deeper than ``MAX_DEPTH`` included.
    """
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if depth > MAX_DEPTH:
        raise FormatError(_too_deep(path))
    depth += 1
    if isinstance(obj, list):
        return [decode_value(v, join_path(path, i), on_ref, depth) for i, v in enumerate(obj)]
    if not isinstance(obj, dict):
        raise FormatError(f"{path}: {type(obj).__name__} is not a JSON value")
    tag = next(iter(obj), None)
    if not (isinstance(tag, str) and tag.startswith("$")):
        return {k: decode_value(v, join_path(path, k), on_ref, depth) for k, v in obj.items()}
    if tag not in _TAGS:
        raise FormatError(f"{path}: unknown tag {tag!r}")
    body = obj[tag]
    if tag in ("$tensor", "$ndarray"):
        _expect(isinstance(body, str) and len(obj) == 1, path, tag)
        return on_ref(tag, body)
    if tag == "$float":
        _expect(body in ("inf", "-inf", "nan") and len(obj) == 1, path, tag)
        return float(body)
    if tag == "$int":
        _expect(
            isinstance(body, str) and _HEX.fullmatch(body) is not None and len(obj) == 1, path, tag
        )
        return int(body, 16)  # a power-of-two base: never limited by the digits limit
    if tag == "$bytes":
        _expect(isinstance(body, str) and len(obj) == 1, path, tag)
        try:
            return base64.b64decode(body, validate=True)
        except binascii.Error as exc:
            raise _malformed(path, tag, exc) from exc
    if tag == "$tuple":
        _expect(isinstance(body, list) and len(obj) == 1, path, tag)
        return tuple(decode_value(v, join_path(path, i), on_ref, depth) for i, v in enumerate(body))
    if tag == "$dict":
        _expect(len(obj) == 1, path, tag)
        return dict(_decode_items(body, path, on_ref, depth))
    if tag == "$odict":
        _expect(set(obj) == {"$odict", "meta"}, path, tag)
        result: OrderedDict[Any, Any] = OrderedDict(_decode_items(body, path, on_ref, depth))
        if obj["meta"] is not None:
            meta = decode_value(obj["meta"], join_path(path, "_metadata"), on_ref, depth)
            result._metadata = meta  # type: ignore[attr-defined]
        return result
    if tag == "$dtype":
        _expect(isinstance(body, str) and len(obj) == 1, path, tag)
        return _dtype_by_name(body, path)
    if tag == "$size":
        _expect(isinstance(body, list) and all(type(d) is int for d in body), path, tag)
        import torch

        return torch.Size(body)
    if tag == "$device":
        _expect(isinstance(body, str) and len(obj) == 1, path, tag)
        import torch

        try:
            return torch.device(body)
        except RuntimeError as exc:  # torch's one error for a device string it cannot parse
            raise _malformed(path, tag, exc) from exc
    if tag == "$numpy":
        _expect(isinstance(body, str) and set(obj) == {"$numpy", "value"}, path, tag)
        try:
            import numpy as np

            dtype = np.dtype(body)
        except TypeError as exc:  # numpy's error for a string that names no dtype
            raise FormatError(
                f"{path or '<root>'}: unknown numpy dtype {body!r}", key=path
            ) from exc
        _expect(dtype.kind in "biufc", path, tag)
        value = decode_value(obj["value"], path, on_ref, depth)
        _expect(type(value) in _SCALARS[dtype.kind], path, tag)
        try:
            return dtype.type(value)
        except OverflowError as exc:  # a number out of the dtype's range
            raise _malformed(path, tag, exc) from exc
    # "$complex"
    _expect(isinstance(body, list) and len(body) == 2 and len(obj) == 1, path, tag)
    real, imag = (decode_value(part, path, on_ref, depth) for part in body)
    _expect(type(real) in (int, float) and type(imag) in (int, float), path, tag)
    return complex(real, imag)


_SCALARS = {
    "b": (bool,),
    "i": (bool, int),
    "u": (bool, int),
    "f": (bool, int, float),
    "c": (bool, int, float, complex),
}
"""The Python values a numpy scalar of each dtype kind is rebuilt from (``.item()`` gives
one of them on save); numpy raises ``TypeError`` for the others."""


def _decode_items(body: Json, path: str, on_ref: RefHook, depth: int) -> list[tuple[Any, Any]]:
    _expect(
        isinstance(body, list) and all(isinstance(p, list) and len(p) == 2 for p in body),
        path,
        "items",
    )
    items = []
    for k_enc, v_enc in body:
        if type(k_enc) is str:  # the common case, decoded inline: a module's state_dict
            key: Any = k_enc
        else:
            key = decode_value(k_enc, path, on_ref, depth)
            try:
                hash(key)
            except TypeError:  # the message says it all: no traceback of hash() to keep
                raise FormatError(f"{path or '<root>'}: unhashable dict key {key!r}") from None
        ref = v_enc.get("$tensor") if type(v_enc) is dict and len(v_enc) == 1 else None
        if type(ref) is str:  # a tensor reference, as decode_value would resolve it
            items.append((key, on_ref("$tensor", ref)))
        else:
            items.append((key, decode_value(v_enc, join_path(path, key), on_ref, depth)))
    return items


def _malformed(path: str, tag: str, exc: Exception) -> FormatError:
    return FormatError(f"{path or '<root>'}: malformed {tag} value ({exc})", key=path)


def _expect(ok: bool, path: str, tag: str) -> None:
    if not ok:
        raise FormatError(f"{path or '<root>'}: malformed {tag} value")
