"""Optimizer state keyed by parameter name instead of position.

``Optimizer.state_dict()`` numbers parameters by their position in the param groups. The
position depends on the order the parameters were registered in, which can differ between
processes (a model that registers parameters while iterating a ``set``). statekeeper stores

``{"by_name": 1, "state": {name: {...}}, "param_groups": [{..., "params": [names]}],
"shapes": {name: [dims]}}``

where ``name`` is ``"<entry>/<parameter name>"`` of a module in the same state
(``"model/encoder.layers.0.weight"``). On load the names are mapped to the live optimizer's
parameters; every unknown name, missing name or shape change is reported together.

Only plain ``torch.optim.Optimizer`` state goes through here; sharded models use
``torch.distributed.checkpoint`` (see the distributed package).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import torch

from statekeeper.state.modules import unwrap

__all__ = [
    "OptimizerChange",
    "class_name",
    "is_named_state",
    "parameter_names",
    "to_named",
    "to_positional",
]

_MARK = "by_name"


def parameter_names(state: Mapping[str, Any]) -> dict[int, str]:
    """``id(parameter) -> "entry/name"`` over every module in ``state`` (first name wins)."""
    names: dict[int, str] = {}
    for entry, obj in state.items():
        if isinstance(obj, torch.nn.Module):
            for pname, param in unwrap(obj).named_parameters():
                names.setdefault(id(param), f"{entry}/{pname}")
    return names


def _positions(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def to_named(
    entry: str, optimizer: torch.optim.Optimizer, names: Mapping[int, str]
) -> dict[str, Any]:
    """The optimizer's state_dict with every parameter index replaced by its name.

    Raises ``ValueError`` when a parameter belongs to no module of the state.
    """
    params = _positions(optimizer)
    unknown = [
        f"group {gi} parameter {i} (shape {tuple(p.shape)})"
        for gi, g in enumerate(optimizer.param_groups)
        for i, p in enumerate(g["params"])
        if id(p) not in names
    ]
    if unknown:
        raise ValueError(
            f"optimizer {entry!r} holds parameters of no module in the state: "
            f"{', '.join(unknown[:5])}. "
            "Put the module that owns them in the same state, so its state can be keyed by name."
        )
    sd = optimizer.state_dict()
    by_index = {i: names[id(p)] for i, p in enumerate(params)}
    # sorted by name: the same bytes whatever order this process registered parameters in
    groups = [{**g, "params": sorted(by_index[i] for i in g["params"])} for g in sd["param_groups"]]
    return {
        _MARK: 1,
        "class": class_name(optimizer),
        "state": dict(sorted((by_index[i], s) for i, s in sd["state"].items())),
        "param_groups": groups,
        "shapes": dict(sorted((by_index[i], list(p.shape)) for i, p in enumerate(params))),
    }


class OptimizerChange(StrEnum):
    """What ``load`` does when the checkpoint's optimizer is of another class than the live one.

    - ``REFUSE`` (default): a mismatch error listing both classes, before anything is loaded.
    - ``RESTART``: a deliberate switch (say AdamW to SGD). The live optimizer keeps its own
      hyper-parameters and starts with empty per-parameter state (moments, momentum buffers
      mean nothing to another algorithm); only each group's learning rate (``lr``, and
      ``initial_lr`` which LR schedulers resume from) carries over from the checkpoint.
    """

    REFUSE = "refuse"
    RESTART = "restart"


def class_name(optimizer: torch.optim.Optimizer) -> str:
    cls = type(optimizer)
    return f"{cls.__module__}.{cls.__qualname__}"


_CARRIED = ("lr", "initial_lr")


def _class_problems(
    entry: str, saved: Mapping[str, Any], optimizer: torch.optim.Optimizer
) -> list[str]:
    """Why the saved state is of another optimizer: another class (recorded since it was
    saved), or hyper-parameters the live optimizer does not have (older checkpoints)."""
    live = class_name(optimizer)
    recorded = saved.get("class")
    # compared by class name: a class defined in the training script is ``__main__.X`` in
    # one run and ``train.X`` when imported in the next
    if isinstance(recorded, str) and recorded.rsplit(".", 1)[-1] != live.rsplit(".", 1)[-1]:
        return [f"{entry}: optimizer class {recorded} in the checkpoint, {live} live"]
    problems = []
    for gi, (sg, lg) in enumerate(zip(saved["param_groups"], optimizer.param_groups, strict=True)):
        foreign = sorted(set(sg) - set(lg))
        if foreign:
            absent = sorted(set(lg) - set(sg))
            problems.append(
                f"{entry}: group {gi} of the checkpoint has hyper-parameter(s) "
                f"{', '.join(foreign)} that the live {live} does not use"
                + (f" (and lacks {', '.join(absent)})" if absent else "")
                + "; it was saved by another optimizer class"
            )
    return problems


_SWITCH_FIX = (
    "build the optimizer the checkpoint was saved with, or pass "
    "on_optimizer_change=OptimizerChange.RESTART to switch deliberately (the live optimizer's "
    "state starts fresh; only the learning rates carry over)"
)


def _restarted(saved: Mapping[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The live optimizer's own state_dict with the saved learning rates."""
    sd = optimizer.state_dict()
    groups = []
    for sg, lg in zip(saved["param_groups"], sd["param_groups"], strict=True):
        groups.append({**lg, **{k: sg[k] for k in _CARRIED if k in sg}})
    return {"state": {}, "param_groups": groups}


def is_named_state(value: object) -> bool:
    return isinstance(value, Mapping) and value.get(_MARK) == 1


def to_positional(
    entry: str,
    saved: Mapping[str, Any],
    optimizer: torch.optim.Optimizer,
    names: Mapping[int, str],
    on_optimizer_change: OptimizerChange = OptimizerChange.REFUSE,
) -> tuple[dict[str, Any], list[str]]:
    """The positional state_dict for the live ``optimizer`` and the list of mismatches.

    Pure: nothing is loaded. An empty mismatch list means the result is safe to load. The
    optimizer's class (and its hyper-parameter names) must match unless ``on_optimizer_change`` is
    ``RESTART``.
    """
    problems: list[str] = []
    if not is_named_state(saved):
        return {}, [f"{entry}: checkpoint holds no name-keyed optimizer state"]
    saved_groups = list(saved["param_groups"])
    live_groups = optimizer.param_groups
    if len(saved_groups) != len(live_groups):
        problems.append(
            f"{entry}: {len(saved_groups)} param group(s) in checkpoint, {len(live_groups)} live"
        )
        return {}, problems
    switched = _class_problems(entry, saved, optimizer)
    if switched:
        if on_optimizer_change is OptimizerChange.RESTART:
            return _restarted(saved, optimizer), []
        return {}, [f"{switched[0]}; {_SWITCH_FIX}", *switched[1:]]
    shapes = dict(saved["shapes"])
    state: dict[int, Any] = {}
    groups = []
    index = 0
    for gi, (sg, lg) in enumerate(zip(saved_groups, live_groups, strict=True)):
        live_names = [names.get(id(p), "") for p in lg["params"]]
        saved_names = set(sg["params"])
        for name in sorted(saved_names - set(live_names)):
            problems.append(
                f"{entry}/{name}: in checkpoint group {gi}, not in the live optimizer's"
            )
        positions = []
        for p, name in zip(lg["params"], live_names, strict=True):
            if not name:
                problems.append(
                    f"{entry}: live group {gi} holds a parameter of no module in the state"
                )
            elif name not in saved_names:
                problems.append(f"{entry}/{name}: missing from checkpoint group {gi}")
            elif list(shapes.get(name, [])) != list(p.shape):
                problems.append(
                    f"{entry}/{name}: shape {tuple(shapes.get(name, []))} in checkpoint, "
                    f"{tuple(p.shape)} live"
                )
            elif name in saved["state"]:
                state[index] = saved["state"][name]
            positions.append(index)
            index += 1
        groups.append({**sg, "params": positions})
    return {"state": state, "param_groups": groups}, problems
