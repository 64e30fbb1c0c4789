"""Save or load a set-ordered model's Adam state in this process (its own PYTHONHASHSEED).

Usage: python -m tests.helpers.set_order MODE DIR; prints JSON [[param name, value], ...].
MODE: order | save-positional | load-positional | save-by-name | load-by-name.
"""

from __future__ import annotations

import json
import sys

import torch
from tests.checkpoint.resume_runs import SetOrder

import statekeeper as sk


def moments(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[list[object]]:
    return [[n, float(opt.state[p]["exp_avg"].sum())] for n, p in model.named_parameters()]


def main() -> None:
    mode, directory = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = SetOrder()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    if mode == "order":
        print(json.dumps([[n, i] for i, (n, _) in enumerate(model.named_parameters())]))
        return
    if mode.startswith("save"):
        for _ in range(3):
            opt.zero_grad()
            model().backward()
            opt.step()
    if mode == "save-positional":  # what plain torch does: state keyed by position
        sk.save(directory, {"model": model.state_dict(), "opt": opt.state_dict()}, step=1)
    elif mode == "load-positional":
        plain = sk.read(directory)
        model.load_state_dict(plain["model"])
        opt.load_state_dict(plain["opt"])
    elif mode == "save-by-name":
        sk.save(directory, {"model": model, "opt": opt}, step=1)
    elif mode == "load-by-name":
        sk.load(directory, {"model": model, "opt": opt})
    print(json.dumps(moments(model, opt)))


if __name__ == "__main__":
    main()
