#!/usr/bin/env python3
"""Every CLI command's ``--json`` output from an older commit against this tree's, on the
same inputs: ``.venv/bin/python scripts/cli_json_compare.py 539a305``.

The older commit is checked out into a temporary git worktree and run from its ``src/``
(``PYTHONPATH``) with this checkout's virtual environment; the inputs (a run of two steps,
a torch.save file, a safetensors file, a model factory) are made by this tree. Commands whose
flags were renamed are given each version's spelling. Durations are not compared.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def say(line: str) -> None:
    sys.stdout.write(line + "\n")


PY = str(ROOT / ".venv" / "bin" / "python")
NEW = str(ROOT / "src")
_old_tree = Path(tempfile.mkdtemp(prefix="cli-old-")) / "tree"
subprocess.run(
    ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(_old_tree), sys.argv[1]],
    check=True,
)
OLD = str(_old_tree / "src")
work = Path(tempfile.mkdtemp(prefix="jsoncmp-"))
os.chdir(work)


def mk() -> None:
    code = r"""
import torch, statekeeper as sk
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
opt = torch.optim.Adam(m.parameters())
m(torch.randn(3, 4)).sum().backward(); opt.step()
for s in (1, 2):
    sk.save("run", {"model": m, "opt": opt, "epoch": s}, step=s, metrics={"loss": 1.0 / s})
    with torch.no_grad():
        m[0].weight.add_(1)
torch.save(m.state_dict(), "weights.pt")
from safetensors.torch import save_file
save_file({k: v.contiguous() for k, v in m.state_dict().items()}, "weights.safetensors")
open("factory.py", "w").write(
    "import torch\ndef build():\n"
    "    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))\n"
)
"""
    subprocess.run([PY, "-c", code], check=True, env={**os.environ, "PYTHONPATH": NEW})


mk()
base = sorted(p.name for p in work.iterdir())
CASES = [
    ("ls", ["ls", "run"], ["ls", "run"]),
    ("ls foreign", ["ls", "weights.safetensors"], ["ls", "weights.safetensors"]),
    ("inspect", ["inspect", "run"], ["inspect", "run"]),
    ("inspect step", ["inspect", "run", "--step", "1"], ["inspect", "run", "--step", "1"]),
    ("inspect pt", ["inspect", "weights.pt"], ["inspect", "weights.pt"]),
    ("verify", ["verify", "run"], ["verify", "run"]),
    ("verify step", ["verify", "run", "--step", "2"], ["verify", "run", "--step", "2"]),
    (
        "diff",
        ["diff", "run/step_000000001", "run/step_000000002"],
        ["diff", "run/step_000000001", "run/step_000000002"],
    ),
    (
        "diff foreign",
        ["diff", "weights.pt", "weights.safetensors"],
        ["diff", "weights.pt", "weights.safetensors"],
    ),
    (
        "convert",
        ["convert", "weights.pt", "out-run", "--step", "5"],
        ["convert", "weights.pt", "-o", "out-run", "--out-step", "5"],
    ),
    (
        "convert st",
        ["convert", "run", "out.safetensors"],
        ["convert", "run", "-o", "out.safetensors"],
    ),
    ("export", ["export", "run", "exp.safetensors"], ["export", "run", "-o", "exp.safetensors"]),
    (
        "average",
        ["average", "run/step_000000001", "run/step_000000002", "-o", "avg", "--step", "9"],
        ["average", "run/step_000000001", "run/step_000000002", "-o", "avg", "--out-step", "9"],
    ),
    ("doctor factory", ["doctor", "factory:build"], ["doctor", "factory:build"]),
    ("doctor ckpt", ["doctor", "run"], ["doctor", "run"]),
    ("error: missing", ["inspect", "nope"], ["inspect", "nope"]),
    ("error: exists", ["export", "run", "weights.pt"], ["export", "run", "-o", "weights.pt"]),
]


def clean() -> None:
    for p in work.iterdir():
        if p.name not in base:
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def run(src: str, args: list[str]) -> tuple[int, object]:
    clean()
    done = subprocess.run(
        [PY, "-m", "statekeeper", *args, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{src}:{work}"},
    )
    try:
        out = json.loads(done.stdout)
    except ValueError:
        out = {"<not json>": done.stdout[-500:], "stderr": done.stderr[-500:]}
    return done.returncode, out


def norm(v):  # durations vary from run to run
    if isinstance(v, dict):
        return {
            k: ("<t>" if k in ("seconds", "elapsed", "duration", "created") else norm(x))
            for k, x in v.items()
        }
    if isinstance(v, list):
        return [norm(x) for x in v]
    return v


same = 0
for name, old_args, new_args in CASES:
    a, b = run(OLD, old_args), run(NEW, new_args)
    a, b = (a[0], norm(a[1])), (b[0], norm(b[1]))
    if a == b:
        same += 1
        say(f"same      {name}  (exit {a[0]})")
    else:
        say(
            f"DIFFERENT {name}\n  old: exit {a[0]} {json.dumps(a[1])[:1500]}"
            f"\n  new: exit {b[0]} {json.dumps(b[1])[:1500]}"
        )
say(f"{same}/{len(CASES)} identical")
subprocess.run(
    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(_old_tree)], check=True
)
shutil.rmtree(work)
