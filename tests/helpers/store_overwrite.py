"""A process killed in the middle of overwriting a step on an object store.

Usage: python -m tests.helpers.store_overwrite ENDPOINT URL. Saves step 1 of the run at
URL again (``overwrite=True``, ``w`` all 2.0); after the new version's first file it
prints ``mid-upload`` and waits for the SIGKILL the test sends.
"""

from __future__ import annotations

import sys

import torch
from tests.helpers.s3 import options_for, pause_after_first_upload

import statekeeper as sk


def main() -> None:
    endpoint, url = sys.argv[1], sys.argv[2]
    storage = sk.storage.FsspecStorage(url, **options_for(endpoint))
    pause_after_first_upload()
    sk.save(storage, {"w": torch.full((1000,), 2.0)}, step=1, overwrite=True)


if __name__ == "__main__":
    main()
