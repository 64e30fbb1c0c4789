"""Tagged JSON: every non-tensor leaf of a state tree, stored without pickle.

Plain JSON carries what it can say exactly: ``None``, ``bool``, ``int`` (any size), finite
``float``, ``str``, ``list`` and ``dict`` whose keys are all strings not starting with ``$``.
Everything else becomes a one-tag object whose first key starts with ``$``:

====================  ==========================================================
``{"$float": s}``      ``"inf"``, ``"-inf"`` or ``"nan"``
``{"$bytes": s}``      base64 of ``bytes`` (``bytearray`` is stored as bytes)
``{"$tuple": [..]}``   a tuple (a list stays a JSON array)
``{"$dict": [[k, v]]}`` a dict with non-string keys or keys starting with ``$``
``{"$odict": [[k, v]], "meta": m}``  an ``OrderedDict``; ``meta`` is the ``_metadata``
                       attribute that ``nn.Module.state_dict()`` attaches (or ``null``)
``{"$dtype": s}``      a ``torch.dtype`` by name, e.g. ``"bfloat16"``
``{"$size": [..]}``    a ``torch.Size``
``{"$device": s}``     a ``torch.device``
``{"$numpy": s, "value": v}``  a numpy scalar of dtype ``s``
``{"$complex": [re, im]}``     a Python ``complex``
``{"$int": hex}``      an ``int`` of more than 4300 decimal digits, in hex (``-`` first
                       when negative): readable whatever ``sys.get_int_max_str_digits()``
``{"$tensor": name}``  a tensor stored in a safetensors shard (see ``state.tree``)
``{"$ndarray": name}`` a numpy array stored as a tensor
====================  ==========================================================

Any other type raises :class:`UnsupportedValueError` naming the key path. Decoding
(:mod:`statekeeper.format.values_decode`) never constructs anything but these types, so a
manifest cannot run code.
"""

from __future__ import annotations

import base64
import math
import re
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from statekeeper.errors import UnsupportedValueError
from statekeeper.format.dtypes import dtype_name
from statekeeper.format.jsondoc import MAX_DEPTH

if TYPE_CHECKING:
    pass

# torch and numpy are imported where a value needs them, not with this module: decoding a
# manifest's state (``statekeeper ls``/``inspect``) must not pay for importing torch

__all__ = ["Json", "RefHook", "TensorHook", "encode_value", "join_path"]

Json = Any  # a JSON-compatible value; recursive aliases add nothing for mypy here

TensorHook = Callable[[str, Any], Json]
RefHook = Callable[[str, str], Any]

_TAGS = frozenset(
    {
        "$float",
        "$bytes",
        "$tuple",
        "$dict",
        "$odict",
        "$dtype",
        "$size",
        "$device",
        "$numpy",
        "$complex",
        "$int",
        "$tensor",
        "$ndarray",
    }
)


_HEX = re.compile(r"-?[0-9a-f]+")
_DEFAULT_DIGITS = 4300  # sys.int_info.default_max_str_digits
_bounds: dict[int, int] = {}


def _long_int() -> int:
    """The smallest magnitude written as ``$int``: 10**4300 (an int of more decimal digits
    than Python converts by default: older readers could not read it either), less where
    this process lowered the limit (``sys.set_int_max_str_digits``)."""
    limit = sys.get_int_max_str_digits()
    digits = _DEFAULT_DIGITS if limit == 0 else min(limit, _DEFAULT_DIGITS)
    bound = _bounds.get(digits)
    if bound is None:
        bound = _bounds[digits] = 10**digits
    return bound


def join_path(path: str, key: object) -> str:
    """The key path of a child, as used in error messages and tensor names."""
    return f"{path}/{key}" if path else str(key)


_np: Any = None
_torch: Any = None


def _libraries() -> tuple[Any, Any]:
    """numpy and torch, imported on first use and kept (encoding runs once per leaf: an
    import statement per call cost a third of its time)."""
    global _np, _torch
    if _torch is None:
        import numpy
        import torch

        _np, _torch = numpy, torch
    return _np, _torch


def _too_deep(path: str) -> str:
    return (
        f"{path or '<root>'}: nested deeper than {MAX_DEPTH} levels of containers (the most "
        "statekeeper stores and reads back)"
    )


def encode_value(value: object, path: str, on_tensor: TensorHook, depth: int = 0) -> Json:
    """Encode ``value`` as tagged JSON; tensors and arrays are handed to ``on_tensor``.

    Containers nest at most ``MAX_DEPTH`` deep: what is saved can always be read back."""
    np, torch = _np, _torch
    if torch is None:
        np, torch = _libraries()

    if value is None or isinstance(value, bool | str):
        return value
    if depth > MAX_DEPTH and not isinstance(value, int | float):  # a container or tagged leaf
        raise UnsupportedValueError(path, value, reason=_too_deep(path))
    depth += 1
    if isinstance(value, np.generic) and value.dtype.kind in "biufc":
        item = value.item()
        return {"$numpy": value.dtype.name, "value": encode_value(item, path, on_tensor, depth)}
    if isinstance(value, int):
        value = int(value)  # int subclasses such as IntEnum lose their class, never their value
        if value.bit_length() <= 2100 or abs(value) < _long_int():  # 2**2100 < 10**640
            return value
        return {"$int": format(value, "x")}
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(float(value))}
    if isinstance(value, torch.Tensor | np.ndarray):
        return on_tensor(path, value)
    if isinstance(value, torch.Size):
        return {"$size": list(value)}
    if isinstance(value, tuple) and type(value) is tuple:
        return {
            "$tuple": [
                encode_value(v, join_path(path, i), on_tensor, depth) for i, v in enumerate(value)
            ]
        }
    if type(value) is list:
        return [encode_value(v, join_path(path, i), on_tensor, depth) for i, v in enumerate(value)]
    if isinstance(value, OrderedDict):
        meta = getattr(value, "_metadata", None)
        return {
            "$odict": _encode_items(value, path, on_tensor, depth),
            "meta": None
            if meta is None
            else encode_value(meta, join_path(path, "_metadata"), on_tensor, depth),
        }
    if type(value) is dict:
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {
                k: encode_value(v, join_path(path, k), on_tensor, depth) for k, v in value.items()
            }
        return {"$dict": _encode_items(value, path, on_tensor, depth)}
    if isinstance(value, bytes | bytearray):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, torch.dtype):
        return {"$dtype": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"$device": str(value)}
    if isinstance(value, complex):
        return {
            "$complex": [
                encode_value(value.real, path, on_tensor, depth),
                encode_value(value.imag, path, on_tensor, depth),
            ]
        }
    raise UnsupportedValueError(path, value)


def _encode_items(
    mapping: dict[Any, Any], path: str, on_tensor: TensorHook, depth: int
) -> list[Json]:
    np, torch = _libraries()

    items = []
    for k, v in mapping.items():
        if isinstance(k, torch.Tensor | np.ndarray | list | dict):
            raise UnsupportedValueError(join_path(path, "<key>"), k)
        items.append(
            [
                encode_value(k, path, on_tensor, depth),
                encode_value(v, join_path(path, k), on_tensor, depth),
            ]
        )
    return items
