"""Saving and loading with every rank of a multi-process job, through
``torch.distributed.checkpoint``; see docs/distributed.md.

Importing this package registers it with the core (:mod:`statekeeper.checkpoint.collective`
and :mod:`statekeeper.checkpoint.adapters`); the package root does that before the first
save or load. The heavy modules (DCP) load on the first job-wide save or load.
"""

from statekeeper.distributed import plugin as _plugin

_plugin.install()
