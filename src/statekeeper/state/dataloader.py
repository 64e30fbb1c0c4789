"""Resuming torchdata's ``StatefulDataLoader`` without disturbing the random streams.

``StatefulDataLoader.load_state_dict`` only stores the state; the resumed iterator is built
lazily by the next ``iter(loader)``. Building it draws from the global torch generator (the
base seed and the sampler's seed, both then overwritten by the saved ones), so a run that
resumes would draw more random numbers than the run that never stopped and diverge.

statekeeper therefore builds the iterator right after loading, while the RNG is not yet
restored (it is restored last), through the loader's public ``state_dict()``: called before
``iter``, it creates the iterator from the pending state and hands exactly that iterator to
the next ``iter(loader)``.
"""

from __future__ import annotations

__all__ = ["prime_after_load"]


def _is_stateful_dataloader(obj: object) -> bool:
    return all(
        hasattr(obj, a)
        for a in ("next_iter_state", "_get_iterator", "_initial_iter_for_state_dict")
    )


def prime_after_load(obj: object) -> None:
    """Build a just-loaded StatefulDataLoader's resumed iterator now (no-op for other objects)."""
    if _is_stateful_dataloader(obj) and getattr(obj, "next_iter_state", None) is not None:
        obj.state_dict()  # type: ignore[attr-defined]
