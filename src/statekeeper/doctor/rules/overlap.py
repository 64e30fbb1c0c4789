"""SK001: a parameter or buffer whose memory overlaps itself.

A tensor built with ``expand``, ``meshgrid`` or any stride-0 view of size > 1 has several
elements at one memory location. ``load_state_dict`` copies into the live tensor in place,
and torch refuses to write into such a tensor ("more than one element of the written-to
tensor refers to a single memory location"): a checkpoint of the model cannot be loaded
into a freshly built instance. Seen by ``torch._debug_has_internal_overlap`` on every
tensor of the state_dict, and confirmed by loading the model's state_dict into an instance
the factory builds anew, with plain ``module.load_state_dict``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rule import Target
from statekeeper.doctor.rules._base import BUILDS_MODEL, DoctorRule
from statekeeper.doctor.rules._probe import isolated_rng, module_path, nbytes

__all__ = ["MemoryOverlap"]

_OVERLAP = "more than one element of the written-to tensor"


def _failed_loads(message: str) -> set[str]:
    """Names whose copy failed for overlap, read from torch's load_state_dict error."""
    failed = set()
    for entry in message.split("\n\t"):
        _, sep, rest = entry.partition('named "')
        if sep and _OVERLAP in rest:
            failed.add(rest.partition('"')[0])
    return failed


class MemoryOverlap(DoctorRule, id="SK001", severity=Severity.ERROR, needs=BUILDS_MODEL):
    summary = "a parameter or buffer overlaps itself in memory: load_state_dict fails"

    def check(self, target: Target) -> Iterator[Finding]:
        state = target.require_model().state_dict(keep_vars=True)
        overlapping = {
            name: t
            for name, t in state.items()
            if isinstance(t, torch.Tensor)
            and t.device.type != "meta"
            and torch._debug_has_internal_overlap(t) == 1
        }
        if not overlapping:
            return
        failed, other = self._confirm(target)
        for name, t in overlapping.items():
            confirmed = name in failed
            if confirmed:
                outcome = (
                    "torch's own load_state_dict into a freshly built instance fails with "
                    f"'{_OVERLAP} refers to a single memory location'"
                )
            elif other:
                outcome = f"loading into a freshly built instance failed otherwise: {other}"
            else:
                outcome = (
                    "loading into a freshly built instance succeeded (that instance does not "
                    "overlap), but any model built like this one cannot be loaded into"
                )
            yield Finding(
                self.id,
                Severity.ERROR if confirmed else Severity.WARNING,
                module_path(name),
                f"'{name}' (shape {tuple(t.shape)}, strides {tuple(t.stride())}) has several "
                "elements at one memory location (built with expand, meshgrid or a stride-0 "
                f"view); {outcome}",
                "build it with its own memory: .clone() or .contiguous() after expand/meshgrid "
                "(or register_buffer(..., persistent=False) if it is a constant rebuilt in "
                "__init__). statekeeper.load handles it anyway: it gives the live tensor its "
                "own memory before loading, and warns",
                tensor=name,
                shape=tuple(t.shape),
                bytes=nbytes(t),
            )

    @staticmethod
    def _confirm(target: Target) -> tuple[set[str], str]:
        """(names torch failed to load for overlap, any other load error) on a fresh build."""
        model = target.require_model()
        with isolated_rng():
            fresh = target.fresh().model
        if fresh is None:
            return set(), "the factory returned no model"
        try:
            fresh.load_state_dict(model.state_dict())
        except RuntimeError as exc:
            failed = _failed_loads(str(exc))
            return failed, "" if failed else str(exc).splitlines()[0]
        return set(), ""
