"""Saving and loading with every rank of a multi-process job, through
``torch.distributed.checkpoint``; see docs/distributed.md."""
