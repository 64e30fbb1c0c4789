"""Reading, comparing and converting checkpoints of other libraries, safely.

``torch.save`` pickles (``.pt``/``.pth``/``.bin``), safetensors files, Hugging Face folders
(sharded with an index or not), Lightning ``.ckpt`` files, Accelerate ``save_state`` folders
and torch DCP folders. Pickle-based files are opened only with ``torch.load`` and
``weights_only=True``, DCP metadata only through an allowlist: nothing in a file can run
code. See ``docs/interop.md``.
"""
