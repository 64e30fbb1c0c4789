"""How `statekeeper average` scales with the number of tensors: N empty tensors.

Run as ``python -m bench.average_empty N {step|safetensors}``: it writes one checkpoint of
N empty float32 tensors (a statekeeper step, or one safetensors file), then times
``statekeeper average CKPT CKPT -o OUT`` in a child process and prints its wall time and
peak resident memory (the child's ``ru_maxrss``).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

import statekeeper as sk

_CHILD = """
import resource, sys
from statekeeper.cli.main import main
sys.argv = ["statekeeper", "average", *sys.argv[1:]]
try:
    main()
finally:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(f"peak_rss_mib {peak}", file=sys.stderr)
"""


def main() -> None:
    count, kind = int(sys.argv[1]), sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        tensors = {f"t{i}": torch.empty(0) for i in range(count)}
        if kind == "safetensors":
            src = Path(tmp, "model.safetensors")
            save_file(tensors, str(src))
        else:
            src = Path(tmp, "run")
            sk.save(src, {"model": tensors}, step=1)
        del tensors
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(src), str(src), "-o", str(Path(tmp, "out"))],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        seconds = time.perf_counter() - start
        peak = [line for line in done.stderr.splitlines() if line.startswith("peak_rss_mib")]
        print(f"{kind} N={count}: exit {done.returncode}, {seconds:.1f} s, {peak[-1:]}")


if __name__ == "__main__":
    main()
