"""``save``: capture a state, write it pickle-free, commit it atomically."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import torch

from statekeeper import __version__
from statekeeper.checkpoint.info import CheckpointInfo
from statekeeper.checkpoint.location import PathOrStorage, committed, resolve_storage, validate_step
from statekeeper.checkpoint.naming import step_entry
from statekeeper.data.torchdata import (
    capture_loader,
    is_stateful_dataloader,
    loader_generators,
    refuse_plain_dataloader,
)
from statekeeper.errors import InvalidArgumentError, StepExistsError
from statekeeper.format.aliases import plan_sharing
from statekeeper.format.checksum import Hasher
from statekeeper.format.manifest import MANIFEST, FileRecord, Manifest, TensorRecord
from statekeeper.format.safetensors_io import layout, stream
from statekeeper.format.tensors import DEFAULT_SHARD_BYTES, dtype_name, plan_shards
from statekeeper.format.values import Json, encode_value
from statekeeper.state.modules import unwrap
from statekeeper.state.optimizer import parameter_names, to_named
from statekeeper.state.rng import RNGState
from statekeeper.state.tree import flatten
from statekeeper.stateful import is_stateful
from statekeeper.storage.base import Storage

__all__ = ["capture", "frozen_names", "save", "write_step"]


def capture(state: Mapping[str, Any]) -> dict[str, Any]:
    """Each entry's ``state_dict()`` (for Stateful objects) or the plain value itself."""
    if not isinstance(state, Mapping):
        raise InvalidArgumentError(
            f"state must be a mapping of names to objects, got {type(state).__name__}"
        )
    for name in state:
        if not isinstance(name, str) or not name or name.startswith("$") or "/" in name:
            raise InvalidArgumentError(
                f"state name {name!r} is not allowed: "
                "use a non-empty str without '/' or a leading '$'"
            )
    names = parameter_names(state)
    owned = loader_generators(state)
    for obj in state.values():
        if isinstance(obj, RNGState) and any(id(g) in owned for g in obj.generators.values()):
            raise InvalidArgumentError(
                "a generator registered with the RNG state is also a data loader's generator; "
                "statekeeper saves it with the loader (in the right order): unregister it"
            )
    captured: dict[str, Any] = {}
    # RNG first: a state_dict() that draws random numbers must not change what is saved
    for name in sorted(state, key=lambda n: not isinstance(state[n], RNGState)):
        obj = state[name]
        refuse_plain_dataloader(name, obj)
        if isinstance(obj, torch.optim.Optimizer):
            try:
                captured[name] = to_named(name, obj, names)
            except ValueError as exc:
                raise InvalidArgumentError(str(exc)) from None
        elif is_stateful_dataloader(obj):
            captured[name] = capture_loader(name, obj)
        elif isinstance(obj, torch.nn.Module):
            captured[name] = unwrap(obj).state_dict()
        else:
            captured[name] = obj.state_dict() if is_stateful(obj) else obj
    return {name: captured[name] for name in state}


def frozen_names(state: Mapping[str, Any]) -> set[str]:
    """Tensor names of parameters that do not require grad (stored in shards of their own)."""
    names: set[str] = set()
    for name, obj in state.items():
        if isinstance(obj, torch.nn.Module):
            params = unwrap(obj).named_parameters()
            names.update(f"{name}/{p}" for p, param in params if not param.requires_grad)
    return names


def _encode_metrics(metrics: Mapping[str, Any] | None) -> dict[str, Json]:
    out: dict[str, Json] = {}
    for key, value in (metrics or {}).items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if (
            not isinstance(key, str)
            or isinstance(value, bool)
            or not isinstance(value, int | float)
        ):
            raise InvalidArgumentError(
                f"metric {key!r}={value!r}: metrics map str names to numbers"
            )
        out[key] = encode_value(value, key, _no_tensor)
    return out


def _no_tensor(path: str, value: Any) -> Json:
    raise InvalidArgumentError(f"metric {path!r} must be a number, not a tensor")


def _hashed(chunks: Iterator[bytes | memoryview], hasher: Hasher) -> Iterator[bytes | memoryview]:
    for chunk in chunks:
        hasher.update(chunk)
        yield chunk


def write_step(
    storage: Storage,
    captured: dict[str, Any],
    *,
    step: int,
    metrics: Mapping[str, Any] | None = None,
    frozen: set[str] | None = None,
    overwrite: bool = False,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    created: str | None = None,
    library: dict[str, str] | None = None,
) -> CheckpointInfo:
    """Write an already captured state as one committed step; the caller holds the writer lock.

    ``created`` and ``library`` override the provenance fields (golden-file tests pin them).
    """
    entry = step_entry(validate_step(step))
    if shard_bytes < 1:
        raise InvalidArgumentError(f"shard_bytes must be positive, got {shard_bytes}")
    exists = any(p.step == step for p in committed(storage))
    if exists and not overwrite:
        raise StepExistsError(
            f"{storage.describe(entry)} is already committed; pass overwrite=True to replace it "
            "or save under another step"
        )
    flat = flatten(captured)
    sharing = plan_sharing(flat.tensors)
    shards = plan_shards(sharing.stored, frozen or (), shard_bytes)
    encoded_metrics = _encode_metrics(metrics)
    files: dict[str, FileRecord] = {}
    tensors: dict[str, TensorRecord] = {}
    txn = storage.begin(entry, replace=exists)
    try:
        for shard in shards:
            tensors_in = {n: sharing.stored[n] for n in shard.names}
            hasher = Hasher()
            txn.write_chunks(shard.file, _hashed(stream(tensors_in, layout(tensors_in)), hasher))
            files[shard.file] = FileRecord(hasher.size, hasher.hexdigest())
            for n in shard.names:
                t = sharing.stored[n]
                tensors[n] = TensorRecord(shard.file, dtype_name(t.dtype), tuple(t.shape))
        manifest = Manifest(
            step=step,
            created=created or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            library=library
            or {"statekeeper": __version__, "torch": torch.__version__.split("+")[0]},
            metrics=encoded_metrics,
            files=files,
            tensors=tensors,
            aliases=sharing.aliases,
            state=flat.skeleton,
        )
        manifest_bytes = manifest.to_bytes()
        txn.write(MANIFEST, manifest_bytes)
        txn.commit()
    except BaseException:
        txn.abort()
        raise
    return CheckpointInfo.from_manifest(storage.describe(entry), manifest, len(manifest_bytes))


def save(
    directory: PathOrStorage,
    state: Mapping[str, Any],
    *,
    step: int,
    metrics: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> CheckpointInfo:
    """Save ``state`` as committed step ``step`` of the run ``directory``.

    ``state`` maps names to Stateful objects (anything with ``state_dict``/``load_state_dict``)
    or plain values. The step becomes visible only once all its bytes are durable. Raises
    ``StepExistsError`` if the step is committed already (unless ``overwrite=True``),
    ``WriterConflictError`` if another live writer holds the directory, and
    ``UnsupportedValueError`` (naming the key path) for a value that would need pickle.
    """
    storage = resolve_storage(directory)
    validate_step(step)
    with storage.writer_lock():
        return write_step(
            storage,
            capture(state),
            step=step,
            metrics=metrics,
            frozen=frozen_names(state),
            overwrite=overwrite,
            shard_bytes=shard_bytes,
        )
