"""One gloo rank of a DDP job whose wrapped module holds its own EMA
(``sk.averaging.AveragedModel`` as an attribute, as in a LightningModule): a few training
steps, then what the rank saw.

Run as ``python -m tests.helpers.ema_ddp RANK WORLD PORT OUT_DIR``; writes
``OUT_DIR/ema-<rank>.json`` with the error (if any) and the EMA's weights.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import statekeeper as sk


class WithEMA(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        self.ema = sk.averaging.AveragedModel(self.net, rule=sk.averaging.EMA(0.9))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # the EMA takes no part in the forward pass


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    model = WithEMA()
    ddp = DDP(model)  # find_unused_parameters=False, the default
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    error = None
    try:
        for _ in range(4):
            ddp(torch.randn(3, 4, generator=gen)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            model.ema.update_parameters(model.net)
    except RuntimeError as exc:
        error = str(exc)
    report = {
        "error": error,
        "trainable": sum(p.numel() for p in ddp.parameters() if p.requires_grad),
        "ema": [p.tolist() for p in model.ema.parameters()],
        "net": [p.tolist() for p in model.net.parameters()],
    }
    (out / f"ema-{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
