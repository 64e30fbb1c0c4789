"""Every code block of README.md and docs/*.md runs as a user copies it.

Python blocks: each page's blocks run in order, in one fresh child process (forked by
tests/helpers/launcher.py, torch imported) and one namespace, in an empty temporary
directory, so a block sees what the page's earlier blocks defined, and a traceback names the
page and its line. Before them runs ``PRELUDE`` (and the page's own entry of ``PAGE_PRELUDES``):
the objects the pages take as the user's own (``model``, ``opt``, ``train_step``,
``total_steps``, a Lightning checkpoint for the interop page...), tiny, and ``total_steps`` a
few steps.

A block that needs what the suite does not have (GPUs and NCCL, an S3 bucket, a framework's
trainer built elsewhere on the page) carries ``<!-- no-run: REASON -->`` on the line before
it; ``<!-- example: NAME -->`` blocks are whole scripts that tests/integrations/ runs killed
and resumed (tests/helpers/doc_examples.py). Both are counted: ``test_skipped_blocks_are_few``
keeps their number in check and says which they are.

Shell blocks are not run (they name placeholders: RUN_DIR, CKPT, A B); each ``statekeeper``
command line in them is checked against the CLI instead: the sub-command exists and each
option it shows is one of that sub-command's options.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from tests.helpers import launcher

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(
    r"^(?:<!-- (?P<mark>no-run|example): ?(?P<why>.*?) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)^```",
    re.M | re.S,
)
MAX_SKIPPED = 12  # no-run blocks: each says why; raise this only with a reason of the same kind

PRELUDE = """
import os, random, signal, sys
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset
import statekeeper as sk

torch.manual_seed(0)

def build_model():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

class AugmentingDataset(Dataset):
    def __init__(self, *args):
        self.x = torch.randn(16, 4)
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return self.x[i] + 0.01 * torch.randn(4), torch.tensor(float(i % 2))

build = build_model
model = build_model()
opt = optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
scaler = torch.amp.GradScaler("cpu")
dataset = TensorDataset(torch.randn(16, 4), torch.randn(16, 2))
loader = sk.data.ResumableLoader(DataLoader(dataset, batch_size=4,
                                       sampler=sk.data.ResumableSampler(dataset, seed=0)))
batches = iter(loader)

def next_batch():
    global batches
    try:
        return next(batches)
    except StopIteration:
        batches = iter(loader)
        return next(batches)

def train_step(batch=None, *args):
    x, y = batch if batch is not None else next_batch()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()

train_one_step = train_step
total_steps = total = 3
step, epoch, loss, val_loss = 1200, 0, 0.5, 0.5
run = run_dir = "runs/exp1"
state = {"model": model, "opt": opt}
"""

# what a page's text says the reader has at hand, beyond PRELUDE
PAGE_PRELUDES = {
    "interop.md": """
from pathlib import Path
from tests.interop import formats
formats.torch_file(Path("pytorch_model.bin"), formats.weights())
formats.hf_folder(Path("hf-model"), formats.weights())
Path("lightning_logs/version_0/checkpoints").mkdir(parents=True)
formats.lightning_ckpt(Path("lightning_logs/version_0/checkpoints/last.ckpt"))
formats.accelerate_folder(Path("accelerate_state"))
formats.dcp_folder(Path("dcp_checkpoint"), {"model": formats.weights()})
torch.save({"model": model.state_dict()}, "a.pt")
sk.save("run", {"model": model}, step=1)
sk.save("runs/exp1", {"model": model}, step=1)
""",
    "format.md": """
import types
base = torch.arange(12.0)
alias = types.SimpleNamespace(shape=(2, 3), stride=(3, 1), offset=2)
""",
}

_RUNNER = """
import json, sys
sys.path.insert(0, sys.argv[2])
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for block in blocks:
    # blank lines first, so that a traceback gives the block's line in its page
    code = "\\n" * (block["line"] - 1) + block["code"]
    exec(compile(code, block["page"], "exec"), namespace)
"""


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the block's first code line
    lang: str
    code: str
    mark: str  # "", "no-run" or "example"
    why: str


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in _BLOCK.finditer(text):
        line = text.count("\n", 0, match.start("code")) + 1
        name = str(page.relative_to(ROOT))
        found.append(
            Block(name, line, match["lang"], match["code"], match["mark"] or "", match["why"] or "")
        )
    return found


def _python(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.lang == "python"]


def _runnable(page: Path) -> list[Block]:
    return [b for b in _python(page) if not b.mark]


RUN_PAGES = [page for page in PAGES if _runnable(page)]  # pages of shell and prose only: none


@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda p: p.name)
def test_python_blocks_run(page: Path, tmp_path: Path) -> None:
    runnable = _runnable(page)
    prelude = PRELUDE + PAGE_PRELUDES.get(page.name, "")
    plan = [{"page": "<prelude>", "line": 1, "code": prelude}]
    plan += [{"page": b.page, "line": b.line, "code": b.code} for b in runnable]
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps(plan))
    work = tmp_path / "work"
    work.mkdir()
    done = launcher.run(
        [sys.executable, "-c", _RUNNER, str(spec), str(ROOT)],
        cwd=work, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{page.name}:\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}"


def test_skipped_blocks_are_few() -> None:
    assert ROOT / "README.md" in RUN_PAGES and len(RUN_PAGES) >= len(PAGES) - 6, RUN_PAGES
    skipped = [b for page in PAGES for b in _python(page) if b.mark == "no-run"]
    for block in skipped:
        assert block.why.strip(), f"{block.page}:{block.line}: a no-run block says why"
    listing = "\n".join(f"{b.page}:{b.line}: {b.why}" for b in skipped)
    assert len(skipped) <= MAX_SKIPPED, f"{len(skipped)} Python blocks are not run:\n{listing}"


def _commands() -> click.Group:
    from statekeeper.cli.main import main

    assert isinstance(main, click.Group)
    return main


def _cli_lines() -> list[tuple[str, list[str]]]:
    lines = []
    for page in PAGES:
        for block in blocks(page):
            if block.lang not in ("bash", "sh", "console", "shell"):
                continue
            for offset, raw in enumerate(block.code.splitlines()):
                command = raw.removeprefix("$ ").strip()
                if not command.startswith("statekeeper "):
                    continue
                words = shlex.split(command, comments=True)
                lines.append((f"{block.page}:{block.line + offset}", words))
    return lines


@pytest.mark.parametrize(("where", "words"), _cli_lines(), ids=lambda v: str(v)[:60])
def test_shell_command_lines_name_real_commands_and_options(where: str, words: list[str]) -> None:
    group = _commands()
    ctx = click.Context(group)
    name = words[1]
    command = group.get_command(ctx, name)
    assert command is not None, f"{where}: `statekeeper {name}` is no command"
    options = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    options |= {"-h", "--help"}
    for word in words[2:]:
        flag = word.split("=", 1)[0]
        if flag.startswith("-") and not re.fullmatch(r"-?\d[\d.e-]*", flag):
            assert flag in options, f"{where}: `statekeeper {name}` has no option {flag}"


def test_readme_error_list_matches_the_classes() -> None:
    import builtins

    import statekeeper as sk

    text = (ROOT / "README.md").read_text()
    start = text.index("Errors all derive from")
    listed = dict(re.findall(r"`(\w+)\(([\w, ]+)\)`", text[start : text.index("\n## ", start)]))
    errors = {
        name
        for name in sk.errors.__all__
        if isinstance(getattr(sk.errors, name), type)
        and issubclass(getattr(sk.errors, name), BaseException)
    }
    errors -= {"StatekeeperError", "CheckpointUnreadableError", "StateMismatchError"}
    errors -= {"LocationError", "InjectedFailure"}  # the kinds; a test helper's failure
    assert sorted(errors - listed.keys()) == [], "public errors the README does not list"
    for name, bases in listed.items():
        cls = getattr(sk.errors, name)
        for base in bases.split(", "):
            parent = getattr(sk.errors, base, None) or getattr(builtins, base)
            assert issubclass(cls, parent), f"README: {name} is no {base}"
