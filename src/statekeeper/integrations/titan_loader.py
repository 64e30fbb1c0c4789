"""A torchtitan data loader's position, stored without pickle and tied to its data-parallel
rank (used by :mod:`statekeeper.integrations.torchtitan`)."""

from __future__ import annotations

from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader

from statekeeper.errors import InvalidArgumentError
from statekeeper.integrations.held import LoaderState

__all__ = ["DataParallelLoader"]


class _Torchdata:
    """A torchtitan data loader seen as the torchdata ``StatefulDataLoader`` it is: its
    plain state (torchtitan's own ``state_dict`` pickles it into bytes)."""

    def __init__(self, loader: StatefulDataLoader) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = StatefulDataLoader.state_dict(self._loader)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        StatefulDataLoader.load_state_dict(self._loader, state)


class DataParallelLoader:
    """A data-parallel rank's loader position, with the rank and the degree it belongs to:
    a run resumed with another data-parallel layout would hand positions to the wrong
    ranks, so it is refused (torchtitan's own manager refuses it too)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.position = LoaderState(_Torchdata(loader))

    def _where(self) -> dict[str, int]:
        return {
            "dp_rank": int(getattr(self.loader, "dp_rank", 0)),
            "dp_world_size": int(getattr(self.loader, "dp_world_size", 1)),
        }

    def state_dict(self) -> dict[str, Any]:
        return {**self._where(), "position": self.position.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = {k: state.get(k) for k in ("dp_rank", "dp_world_size")}
        live = self._where()
        if saved != live:
            raise InvalidArgumentError(
                f"the data loader was saved by data-parallel rank {saved['dp_rank']} of "
                f"{saved['dp_world_size']} and is loaded by rank {live['dp_rank']} of "
                f"{live['dp_world_size']}: positions cannot be mapped across layouts; pass "
                "checkpoint.exclude_from_loading=['dataloader'] to restart the data"
            )
        self.position.load_state_dict(state["position"])
