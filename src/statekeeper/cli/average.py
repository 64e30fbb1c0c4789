"""``statekeeper average``: the (weighted) mean of several checkpoints, saved as a new step."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import click
import torch

from statekeeper.averaging.offline import average_checkpoints, normalize_weights
from statekeeper.averaging.states import average_states
from statekeeper.catalog.detect import foreign_format
from statekeeper.catalog.info import CheckpointInfo
from statekeeper.catalog.location import locate
from statekeeper.checkpoint.save import save
from statekeeper.cli import render
from statekeeper.cli.command import command, respond
from statekeeper.cli.options import out_option, out_step_option
from statekeeper.errors import InvalidArgumentError, StepExistsError
from statekeeper.incremental.reuse import Incremental
from statekeeper.interop.reading import read
from statekeeper.progress import Progress

__all__ = ["average", "parse_weights"]


def _average_foreign(
    ckpts: tuple[str, ...],
    out: str,
    raw: list[float] | None,
    key: str | None,
    out_step: int | None,
    overwrite: bool,
    progress: Progress,
) -> tuple[CheckpointInfo, int]:
    """Inputs some of which are foreign: each read whole, one at a time (``average_states``).
    The output step defaults to the newest statekeeper input's, or 0. Returns the saved
    step and how many tensors it holds (tied ones once)."""
    weights = [1.0] * len(ckpts) if raw is None else raw
    steps = [locate(c, None).step for c in ckpts if foreign_format(c) is None]
    states = _read_each(ckpts)
    result = average_states(states, weights, key=key, progress=progress)
    chosen = out_step if out_step is not None else max([s for s in steps if s >= 0], default=0)
    tensors = _distinct_tensors(result)
    info = save(out, result, step=chosen, overwrite=overwrite, incremental=Incremental.WRITE_ALL)
    return info, tensors  # WRITE_ALL: a new set of tensors, as average_checkpoints saves it


def _read_each(ckpts: tuple[str, ...]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each input read in turn; one named again right after itself is not read again (its
    state is handed over twice: the same sum, one read)."""
    for i, ckpt in enumerate(ckpts):
        if i == 0 or ckpts[i - 1] != ckpt:
            state = read(ckpt)
        yield ckpt, state
        if i + 1 < len(ckpts) and ckpts[i + 1] != ckpt:
            del state  # dropped before the next input is read


def _distinct_tensors(state: object) -> int:
    """How many tensor objects ``state`` holds (tied ones once): a walk, nothing encoded."""
    seen: set[int] = set()
    stack = [state]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            seen.add(id(item))
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return len(seen)


def parse_weights(text: str | None) -> list[float] | None:
    """``"0.2,0.3,0.5"`` -> ``[0.2, 0.3, 0.5]``; None stays None (a uniform mean)."""
    if text is None:
        return None
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise InvalidArgumentError(
            f"--weights {text!r}: expected comma-separated numbers, one per CKPT, "
            "such as 0.2,0.3,0.5"
        ) from None


@command("average", json="a report")
@click.argument("ckpts", metavar="CKPT...", nargs=-1, required=True)
@out_option("OUT", "Run directory (path or URL) to save the average into (as a new step).")
@click.option(
    "--weights",
    metavar="W1,W2,...",
    help="One weight per CKPT, comma-separated (normalized to sum 1). Default: uniform.",
)
@click.option("--key", help="Average only this top-level entry (e.g. model); save just it.")
@out_step_option("the newest input's")
@click.option(
    "--overwrite", is_flag=True, help="Replace the output step if OUT already has it committed."
)
def average(
    ckpts: tuple[str, ...],
    out: str,
    weights: str | None,
    key: str | None,
    out_step: int | None,
    overwrite: bool,
    as_json: bool,
) -> None:
    """Average the weights of the checkpoints CKPT... into a new step of the run OUT.

    Each CKPT is a step directory or a run directory (its newest step), or any file or folder
    the other commands read (torch.save files, safetensors files, Hugging Face folders): those
    are read one at a time, then averaged. Floating tensors are averaged in float64 and keep
    their dtype; integer tensors and other values come from the newest input (the last one
    when any input is foreign). Exit status: 0 done, 1 the checkpoints do not match or are
    damaged, 2 bad arguments or nothing found.
    """
    tensors = 0

    def count(done: int, total: int) -> None:
        nonlocal tensors
        tensors = total
        if update is not None:
            update(done, total)

    def read_inputs(done: int, total: int) -> None:
        if update is not None:
            update(done, total)

    with render.reported_errors():
        raw = parse_weights(weights)
        normalized = normalize_weights(raw, len(ckpts))
        foreign = [c for c in ckpts if foreign_format(c) is not None]
        inputs = [c if c in foreign else locate(c, None).path() for c in ckpts]
        with render.ByteProgress(enabled=not as_json, counts=True) as bar:
            update = bar.phase("averaging tensors" if not foreign else "reading and averaging")
            try:
                if foreign:  # progress counts inputs read; the summary counts tensors
                    info, tensors = _average_foreign(ckpts, out, raw, key, out_step, overwrite,
                                                     read_inputs)  # fmt: skip
                else:
                    info = average_checkpoints(
                        ckpts, out, weights=raw, key=key, out_step=out_step, overwrite=overwrite,
                        progress=count,
                    )  # fmt: skip
            except StepExistsError as exc:  # the library's advice names a Python argument
                render.fail(
                    f"{exc.path} is already committed; pass --overwrite to replace it, or "
                    "--out-step N to save under another step",
                    1,
                )
    summary = {
        "out": info.path,
        "step": info.step,
        "inputs": inputs,
        "weights": normalized,
        "tensors": tensors,
        "bytes": info.bytes,
    }
    respond(as_json, summary, render.averaged)
