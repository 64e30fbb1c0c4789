"""The first lines of a child script in which importing torch or numpy raises: for the
checks that a code path never imports them (they must run in a fresh interpreter)."""

REFUSE_TORCH = r"""
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "numpy"):
            raise ImportError(f"{name} was imported")

sys.meta_path.insert(0, Refuse())
"""
