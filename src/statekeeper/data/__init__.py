"""Exact data order on resume: resumable samplers, loaders and per-sample seeding.

Importing this package registers its loaders with the core's adapter table
(:mod:`.adapters`); the package root does that before the first save or load.
"""

from statekeeper.data import adapters as _adapters

_adapters.install()
