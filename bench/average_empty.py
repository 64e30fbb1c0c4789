"""How `statekeeper average` scales with the number of tensors: N empty float32 tensors.

Run as ``python -m bench.average_empty N [step|safetensors] [same|distinct|one]``:

- a child process writes checkpoints of N empty float32 tensors, as statekeeper steps or
  as safetensors files: ``same`` averages one checkpoint given twice (``A A``),
  ``distinct`` two equal checkpoints in two places (``A B``), ``one`` a single input;
- it runs ``statekeeper average INPUTS -o OUT`` in a child process, and the peer in another:
  a child that reads every input with ``safetensors.torch.load_file`` and writes one output
  with ``save_file`` (the reference library's own read and write of the same tensors, no
  averaging, no checks, no commit);
- it prints each child's wall time and peak resident memory (``ru_maxrss``), and
  statekeeper's as a multiple of the peer's. Both children pay the same interpreter and
  torch start-up (about 2 s); it is included.

Empty tensors have no bytes: what is measured is the per-tensor work (headers, manifests,
planning, the save pipeline).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

_PEAK = """
import resource, sys
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(f"peak_rss_mib {peak}", file=sys.stderr)
"""
_STATEKEEPER = """
import sys
from statekeeper.cli.main import main
sys.argv = ["statekeeper", "average", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    if exc.code:
        raise
finally:
""" + "".join(f"    {line}\n" for line in _PEAK.strip().splitlines())
_PEER = (
    """
import sys
from safetensors.torch import load_file, save_file
*inputs, out = sys.argv[1:]
for path in inputs:
    tensors = load_file(path)
save_file(tensors, out)
"""
    + _PEAK
)


_MAKE = """
import sys
from pathlib import Path
import torch
from safetensors.torch import save_file
import statekeeper as sk
count, kind, tmp, *places = sys.argv[1:]
tensors = {f"t{i}": torch.empty(0) for i in range(int(count))}
for place in places:
    save_file(tensors, str(Path(tmp, place + ".safetensors")))
    if kind == "step":
        sk.save(Path(tmp, place), {"model": tensors}, step=1)
"""


def _run(code: str, args: list[str]) -> tuple[float, int, int]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    peak = [int(line.split()[1]) for line in done.stderr.splitlines() if "peak_rss_mib" in line]
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
    return seconds, (peak[-1] if peak else -1), done.returncode


def main() -> None:
    count = int(sys.argv[1])
    kind = sys.argv[2] if len(sys.argv) > 2 else "step"
    inputs = sys.argv[3] if len(sys.argv) > 3 else "same"
    if kind not in ("step", "safetensors") or inputs not in ("same", "distinct", "one"):
        raise SystemExit(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        places = ["a"] if inputs != "distinct" else ["a", "b"]
        files = [str(Path(tmp, f"{place}.safetensors")) for place in places]
        # made in a child: a child's ru_maxrss counts its parent's size when it was forked,
        # so this process stays small for the timed children
        made = subprocess.run(
            [sys.executable, "-c", _MAKE, str(count), kind, tmp, *places], check=False
        )
        if made.returncode:
            raise SystemExit("could not write the inputs")
        srcs = [str(Path(tmp, p)) for p in places] if kind == "step" else files
        peer_srcs = files
        if inputs == "same":
            srcs, peer_srcs = srcs * 2, peer_srcs * 2
        sk_s, sk_mib, rc = _run(_STATEKEEPER, [*srcs, "-o", str(Path(tmp, "out"))])
        peer_s, peer_mib, _ = _run(_PEER, [*peer_srcs, str(Path(tmp, "peer.safetensors"))])
        print(
            f"N={count} {kind} inputs={inputs}: statekeeper average exit {rc}, {sk_s:.1f} s, "
            f"peak {sk_mib} MiB | peer load_file+save_file {peer_s:.1f} s, peak {peer_mib} MiB"
            f" | ratio time {sk_s / peer_s:.2f}x, memory {sk_mib / max(peer_mib, 1):.2f}x"
        )


if __name__ == "__main__":
    main()
