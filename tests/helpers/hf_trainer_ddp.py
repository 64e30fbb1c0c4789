"""``tests.helpers.hf_trainer_run`` as a 2-process job (CPU, gloo), as ``torchrun``
would start it: the same arguments; rank 1 writes its results to OUT_FILE.rank1. Exits 0
when both ranks end, 9 when a rank was killed (tests/helpers/two_ranks.py)."""

from tests.helpers.two_ranks import run

if __name__ == "__main__":
    run("tests.helpers.hf_trainer_run")
