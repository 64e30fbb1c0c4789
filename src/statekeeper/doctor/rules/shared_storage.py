"""SK007: tensors that share storage, and state_dict keys carrying a wrapper's prefix.

Shared storage (tied weights, a buffer that is a view of a parameter) is grouped exactly the
way ``statekeeper.save`` groups it (:func:`statekeeper.format.aliases.plan_sharing`, on the
unwrapped model, under the names save stores): each alias is reported once, as INFO, since
statekeeper stores it once and re-ties it on load while a naive save duplicates it
(safetensors refuses it) or un-ties it.

Wrapper prefixes are seen in the keys: ``_orig_mod.`` (``torch.compile``) anywhere in a
key, and ``module.`` (``DataParallel`` / ``DistributedDataParallel``) when every key of the
model starts with it or the module at that path is one of those wrappers. Each prefix is
reported once, with the number of keys it prefixes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rule import Target
from statekeeper.doctor.rules._base import MODEL, DoctorRule
from statekeeper.doctor.rules._probe import module_path, nbytes
from statekeeper.format.aliases import plan_sharing
from statekeeper.state.modules import unwrap

__all__ = ["SharedStorage", "wrapper_prefixes"]

COMPILE = "_orig_mod"
PARALLEL = "module"
_PARALLEL_TYPES = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
TIED_PROBLEM = "shares storage with {}; a naive save duplicates or un-ties it"
TIED_FIX = "nothing to do: statekeeper saves it once and re-ties it on load"


def wrapper_prefixes(keys: list[str], parallel_at: frozenset[str] = frozenset()) -> dict[str, int]:
    """Wrapper prefix (``"_orig_mod."``, ``"enc._orig_mod."``, ``"module."``) -> keys under it.

    ``module.`` counts only when every key starts with it, or its path is in ``parallel_at``
    (modules known to be DataParallel / DDP wrappers): a submodule may be named ``module``.
    """
    found: dict[str, int] = {}
    for key in keys:
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            path = ".".join(parts[:i])
            if part == COMPILE or (part == PARALLEL and path in parallel_at):
                prefix = ".".join(parts[: i + 1]) + "."
                found[prefix] = found.get(prefix, 0) + 1
    if keys and all(k.startswith(PARALLEL + ".") for k in keys):
        found.setdefault(PARALLEL + ".", len(keys))
    return found


def wrapper_text(prefix: str, count: int, what: str = "state_dict keys") -> tuple[str, str]:
    """(problem, fix) for ``count`` keys under a wrapper ``prefix``."""
    wrapped = prefix.rstrip(".")
    kind = "torch.compile" if wrapped.rsplit(".", 1)[-1] == COMPILE else "DataParallel/DDP"
    problem = (
        f"{count} {what} start with '{prefix}' (the {kind} wrapper): a checkpoint saved from "
        "the wrapper does not load into the bare model, and one saved from the bare model "
        "does not load into the wrapper"
    )
    fix = (
        f"save and load the unwrapped model (model.{wrapped}), not the wrapper or its "
        "state_dict() (statekeeper.save and load unwrap torch.compile, DataParallel and DDP "
        "models passed to them directly)"
    )
    return problem, fix


class SharedStorage(DoctorRule, id="SK007", severity=Severity.WARNING, needs=MODEL):
    summary = "tensors that share storage (tied weights), and wrapper prefixes in keys"

    def check(self, target: Target) -> Iterator[Finding]:
        model = target.require_model()
        state = model.state_dict()
        inner = unwrap(model).state_dict()  # the names statekeeper.save stores them under
        yield from self._aliases({k: v for k, v in inner.items() if isinstance(v, torch.Tensor)})
        parallel_at = frozenset(
            path for path, mod in model.named_modules() if isinstance(mod, _PARALLEL_TYPES)
        )
        inner_parallel = frozenset(
            path for path, mod in unwrap(model).named_modules() if isinstance(mod, _PARALLEL_TYPES)
        )
        # an outermost wrapper is stripped by statekeeper.save: information only
        inside = wrapper_prefixes(list(inner), inner_parallel)
        for prefix, count in wrapper_prefixes(list(state), parallel_at).items():
            problem, fix = wrapper_text(prefix, count)
            severity = Severity.WARNING if prefix in inside else Severity.INFO
            yield Finding(self.id, severity, prefix.rstrip("."), problem, fix)

    def _aliases(self, tensors: Mapping[str, torch.Tensor]) -> Iterator[Finding]:
        plan = plan_sharing(dict(tensors))
        groups: dict[str, list[str]] = {}
        for name, alias in plan.aliases.items():
            groups.setdefault(alias.base, []).append(name)
        for name, alias in plan.aliases.items():
            others = [alias.base] if alias.base in tensors else []
            others += [m for m in groups[alias.base] if m != name]
            t = tensors[name]
            yield Finding(
                self.id, Severity.INFO, module_path(name, "<root>"),
                TIED_PROBLEM.format(", ".join(others)), TIED_FIX,
                tensor=name, shape=tuple(t.shape), bytes=nbytes(t),
            )  # fmt: skip
