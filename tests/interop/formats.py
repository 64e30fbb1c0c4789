"""Checkpoints of every foreign format, written by the libraries that own the format.

torch (``torch.save``, zip and legacy), safetensors (``save_file``), huggingface_hub
(``save_torch_state_dict``: sharded safetensors and ``.bin`` folders with their index), torch
DCP (``torch.distributed.checkpoint.save``), Lightning (``Trainer.fit`` + ``save_checkpoint``)
and Accelerate (``Accelerator.save_state``). Tensors are tiny so that every test stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class Net(torch.nn.Module):
    """Linear + BatchNorm (an int64 buffer) + a non-persistent buffer (never in state_dict)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.norm = torch.nn.BatchNorm1d(3)
        self.register_buffer("scratch", torch.zeros(2), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(self.fc(x))
        return out


class TiedLM(torch.nn.Module):
    """An embedding whose output head shares its weight, as language models do."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(7, 4)
        self.mix = torch.nn.Linear(4, 4)
        self.lm_head = torch.nn.Linear(4, 7, bias=False)
        self.lm_head.weight = self.embed.weight


def net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    model = Net()
    model(torch.randn(5, 4))  # moves the BatchNorm statistics and counter
    return model


def trained(seed: int = 0) -> tuple[Net, torch.optim.Optimizer]:
    model = net(seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return model, opt


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in net(seed).state_dict().items()}


def torch_file(path: Path, obj: Any, *, legacy: bool = False) -> Path:
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    return path


def safetensors_file(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def hf_folder(folder: Path, tensors: dict[str, torch.Tensor], *, safe: bool = True) -> Path:
    """A sharded model folder (index + shards) written by huggingface_hub."""
    from huggingface_hub import save_torch_state_dict

    folder.mkdir(parents=True, exist_ok=True)
    save_torch_state_dict(tensors, folder, max_shard_size=64, safe_serialization=safe)
    return folder


def dcp_folder(folder: Path, state: dict[str, Any]) -> Path:
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        # (typing) re-exported by torch without __all__
        dcp.save(state, checkpoint_id=str(folder))  # type: ignore[attr-defined]
    return folder


def lightning_ckpt(path: Path, seed: int = 0) -> tuple[Path, dict[str, torch.Tensor]]:
    """A real Trainer run of one step, then ``trainer.save_checkpoint``. Returns the path and
    the module's state_dict at save time."""
    import logging
    import warnings

    import pytorch_lightning as pl

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = net(seed)

        def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
            out: torch.Tensor = self.model(batch[0]).pow(2).mean()
            return out

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=0.01)

    torch.manual_seed(seed)
    data = torch.utils.data.TensorDataset(torch.randn(8, 4))
    module = Module()
    trainer = pl.Trainer(
        max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", default_root_dir=str(path.parent),
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's own deprecation notices
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    trainer.save_checkpoint(path)
    return path, {k: v.clone() for k, v in module.state_dict().items()}


def accelerate_folder(folder: Path, seed: int = 0) -> tuple[Path, dict[str, Any]]:
    """``Accelerator.save_state`` after one step. Returns the folder and what it saved."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = net(seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    model, opt, sched = accelerator.prepare(model, opt, sched)
    accelerator.backward(model(torch.randn(5, 4)).sum())
    opt.step()
    sched.step()
    accelerator.save_state(str(folder))
    expected = {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
    }
    return folder, expected


# ---------------------------------------------------------------- hostile torch.save files
# Crafted the way an attacker would: a real torch.save archive whose pickle or records are
# replaced. Used by test_hostile_foreign.py.

TIB4 = 4 << 40
"""4 TiB, in bytes."""


def _zip_bytes(obj: Any) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def rezip(obj: Any, *, pickle: bytes | None = None, deflate: bool = False) -> bytes:
    """``torch.save(obj)`` with its ``data.pkl`` replaced by ``pickle`` and, with
    ``deflate``, every entry compressed (which ``torch.save`` never does)."""
    import io
    import zipfile

    source = zipfile.ZipFile(io.BytesIO(_zip_bytes(obj)))
    out = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    with zipfile.ZipFile(out, "w") as archive:
        for info in source.infolist():
            data = source.read(info.filename)
            if pickle is not None and info.filename.endswith("/data.pkl"):
                data = pickle
            archive.writestr(info.filename, data, compress_type=method)
    return out.getvalue()


def compressed_item(obj: Any) -> bytes:
    return rezip(obj, deflate=True)


def _claiming_pickle(numel: int, stride: int, storage_numel: int, legacy: bool) -> bytes:
    """The pickle of ``{"w": tensor}`` whose FloatStorage claims ``storage_numel`` elements
    and whose tensor claims ``numel`` elements with ``stride``."""
    import collections
    import io
    import pickle

    class Ref:
        pass

    ref = Ref()

    class Tensor:
        def __reduce__(self) -> tuple[Any, ...]:
            metadata: collections.OrderedDict[str, Any] = collections.OrderedDict()
            args = (ref, 0, (numel,), (stride,), False, metadata)
            return (torch._utils._rebuild_tensor_v2, args)

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if obj is not ref:
                return None
            pid = ("storage", torch.FloatStorage, "0", "cpu", storage_numel)
            return (*pid, None) if legacy else pid

    buffer = io.BytesIO()
    Pickler(buffer, protocol=2).dump({"w": Tensor()})
    return buffer.getvalue()


def stride0_pt(path: Path, nbytes: int = TIB4) -> Path:
    """A zip torch.save file holding one float of data viewed with stride 0 as ``nbytes``."""
    path.write_bytes(rezip({"w": torch.ones(1)}, pickle=_claiming_pickle(nbytes // 4, 0, 1, False)))
    return path


def legacy_claiming(path: Path, nbytes: int) -> Path:
    """A legacy (pre-1.6) torch.save file whose one storage claims ``nbytes`` but holds 4."""
    import io
    import pickle
    import struct

    buffer = io.BytesIO()
    torch.save({"w": torch.ones(1)}, buffer, _use_new_zipfile_serialization=False)
    buffer.seek(0)
    for _ in range(3):  # magic number, protocol, system info
        pickle.load(buffer)
    head = buffer.getvalue()[: buffer.tell()]
    body = _claiming_pickle(nbytes // 4, 1, nbytes // 4, True)
    keys = pickle.dumps(["0"], protocol=2)
    path.write_bytes(head + body + keys + struct.pack("<q", 1) + b"\0" * 4)
    return path


def deep_list_pt(path: Path, depth: int) -> Path:
    """A zip torch.save file whose object is ``depth`` nested lists."""
    data = b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."
    path.write_bytes(rezip({}, pickle=data))
    return path


def deep_tuple_pt(path: Path, depth: int) -> Path:
    """A zip torch.save file whose dict has a key of ``depth`` nested tuples."""
    data = b"\x80\x02}" + b")" + b"\x85" * depth + b"K\x01s."
    path.write_bytes(rezip({}, pickle=data))
    return path


def pickle_global(module: bytes, name: bytes) -> bytes:
    """The GLOBAL opcode naming ``module.name``: what a hostile pickle asks to import."""
    return b"c" + module + b"\n" + name + b"\n"


def pickle_text(value: str) -> bytes:
    """The BINUNICODE opcode pushing ``value``."""
    raw = value.encode()
    return b"X" + len(raw).to_bytes(4, "little") + raw
