"""What each entry of an app state is in a multi-process job, and its distributed state dict.

- modules: sharded (FSDP2 / DTensor) or replicated (DDP, plain); captured with DCP's
  ``get_model_state_dict`` (wrapper prefixes removed, DTensors kept sharded);
- optimizers: DCP's ``get_optimizer_state_dict`` (keyed by parameter name; with
  ``get_state_dict`` when a module has one optimizer), stored in
  statekeeper's name-keyed optimizer format so any world size, one process included,
  can load it;
- per rank: ``RNGState``, data loaders (``StatefulDataLoader``, ``ResumableLoader``) and
  ``PerRank`` entries: every rank's own (their adapters say so: ``Kind.PER_RANK``);
- everything else is replicated: rank 0's value is saved and loaded on every rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from statekeeper.checkpoint.adapters import Kind, adapter_for
from statekeeper.checkpoint.checks import Strict
from statekeeper.checkpoint.save import capture
from statekeeper.errors import InvalidArgumentError
from statekeeper.state.modules import unwrap

__all__ = [
    "Split",
    "apply_module",
    "apply_optimizer",
    "capture_distributed",
    "optimizer_problems",
    "split",
]


@dataclass(frozen=True)
class Split:
    """The entries of a state by kind (names in the state's order)."""

    modules: dict[str, torch.nn.Module]
    optimizers: dict[str, tuple[torch.optim.Optimizer, str]]  # -> (optimizer, module entry)
    per_rank: dict[str, Any]
    replicated: dict[str, Any]


def _owner(name: str, optimizer: torch.optim.Optimizer, modules: Mapping[str, Any]) -> str:
    wanted = {id(p) for g in optimizer.param_groups for p in g["params"]}
    for entry, module in modules.items():
        if wanted <= {id(p) for p in module.parameters()}:
            return entry
    raise InvalidArgumentError(
        f"optimizer {name!r} holds parameters of no single module in the state; put the module "
        "that owns all of them in the same state (a distributed save keys optimizer state by "
        "that module's parameter names)"
    )


def split(state: Mapping[str, Any]) -> Split:
    """The entries of ``state`` by the :class:`~statekeeper.checkpoint.adapters.Kind` of
    their adapter (the one table the local path uses too)."""
    kinds = {n: adapter_for(o).kind for n, o in state.items()}

    def of(*wanted: Kind) -> dict[str, Any]:
        return {n: o for n, o in state.items() if kinds[n] in wanted}

    modules = of(Kind.MODULE)
    optimizers = {n: (o, _owner(n, o, modules)) for n, o in of(Kind.OPTIMIZER).items()}
    return Split(modules, optimizers, of(Kind.RNG, Kind.PER_RANK), of(Kind.REPLICATED))


def _named_optimizer(entry: str, osd: Mapping[str, Any], shapes: Mapping[str, Any]) -> Any:
    def key(fqn: Any) -> str:
        return f"{entry}/{fqn}"

    groups = [{**g, "params": sorted(key(p) for p in g["params"])} for g in osd["param_groups"]]
    names = {p for g in groups for p in g["params"]}
    return {
        "by_name": 1,
        "state": dict(sorted((key(fqn), s) for fqn, s in osd["state"].items())),
        "param_groups": groups,
        "shapes": {n: list(shapes[n]) for n in sorted(names)},
    }


def _without_grads(optimizer: torch.optim.Optimizer) -> list[tuple[torch.Tensor, Any]]:
    params = [p for g in optimizer.param_groups for p in g["params"]]
    stash = [(p, p.grad) for p in params]
    for p in params:
        p.grad = None
    return stash


def _optimizer_state(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, initialize: bool
) -> Mapping[str, Any]:
    """DCP's optimizer state dict (FQN-keyed). An optimizer that has not stepped yet has no
    state: DCP would create it with a zero-lr step (``step`` counters at 1), which a save
    must not do (it would change the run), so a save records it empty. A load
    (``initialize``) needs that state to read into: grads are set aside for it, and put back."""
    if optimizer.state:
        return get_optimizer_state_dict(module, optimizer)
    if initialize:
        stash = _without_grads(optimizer)
        try:
            return get_optimizer_state_dict(module, optimizer)
        finally:
            for p, grad in stash:
                p.grad = grad
    names = {id(p): n for n, p in unwrap(module).named_parameters()}
    groups = [
        {
            **{k: v for k, v in g.items() if k != "params"},
            "params": [names[id(p)] for p in g["params"]],
        }
        for g in optimizer.param_groups
    ]
    return {"state": {}, "param_groups": groups}


def _paired(parts: Split) -> dict[str, str]:
    """Module entry -> its optimizer's entry, for modules with one optimizer that has state:
    DCP's ``get_state_dict`` captures the two with one pass over the module's parameter
    names, about half of the separate calls' Python work (inside an async save's stall)."""
    by_owner: dict[str, list[str]] = {}
    for name, (_, owner) in parts.optimizers.items():
        by_owner.setdefault(owner, []).append(name)
    return {
        owner: names[0]
        for owner, names in by_owner.items()
        if len(names) == 1 and parts.optimizers[names[0]][0].state
    }


def capture_distributed(parts: Split, *, initialize: bool = False) -> dict[str, Any]:
    """State dicts of modules, optimizers and replicated entries (DTensors stay sharded).

    ``initialize`` (for a load) gives optimizers that have not stepped their state, to
    read into; a load that fails clears it again."""
    captured: dict[str, Any] = {}
    shapes: dict[str, Any] = {}
    paired = _paired(parts)
    optimizer_sds: dict[str, Mapping[str, Any]] = {}
    for name, module in parts.modules.items():
        partner = paired.get(name)
        if partner is None:
            sd = get_model_state_dict(module)
        else:
            sd, optimizer_sds[partner] = get_state_dict(module, parts.optimizers[partner][0])
        captured[name] = sd
        shapes.update({f"{name}/{k}": tuple(getattr(v, "shape", ())) for k, v in sd.items()})
    for name, (optimizer, owner) in parts.optimizers.items():
        osd = optimizer_sds.get(name)
        if osd is None:
            osd = _optimizer_state(parts.modules[owner], optimizer, initialize)
        captured[name] = _named_optimizer(owner, osd, shapes)
    captured.update(capture(parts.replicated))
    return captured


def _options(strict: Strict) -> StateDictOptions:
    return StateDictOptions(strict=strict is Strict.EXACT)


def apply_module(module: torch.nn.Module, saved: Mapping[str, Any], strict: Strict) -> None:
    set_model_state_dict(module, dict(saved), options=_options(strict))


def optimizer_problems(name: str, owner: str, saved: Any) -> list[str]:
    """Why the raw (JSON) optimizer entry ``saved`` cannot be loaded; empty when it can."""
    if not (isinstance(saved, Mapping) and saved.get("by_name") == 1):
        return [f"{name}: checkpoint holds no name-keyed optimizer state"]
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, Mapping) for g in groups):
        return [f"{name}: checkpoint holds malformed param_groups"]
    names = [p for g in groups for p in g.get("params", [])]
    return [
        f"{name}: parameter {p!r} does not belong to module {owner!r}"
        for p in names
        if not isinstance(p, str) or not p.startswith(f"{owner}/")
    ][:10]


def apply_optimizer(
    optimizer: torch.optim.Optimizer,
    module: torch.nn.Module,
    owner: str,
    saved: Any,
    strict: Strict,
) -> None:
    """Load name-keyed optimizer state (checked by :func:`optimizer_problems`) through DCP's
    ``set_optimizer_state_dict``; a checkpoint of an optimizer that had not stepped leaves
    the live one without state too."""
    strip = len(owner) + 1
    osd: dict[str, Any] = {
        "state": {k[strip:]: v for k, v in saved["state"].items()},
        "param_groups": [
            {**g, "params": [p[strip:] for p in g["params"]]} for g in saved["param_groups"]
        ],
    }
    set_optimizer_state_dict(module, optimizer, osd, options=_options(strict))
    if not osd["state"]:
        optimizer.state.clear()
