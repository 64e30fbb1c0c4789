"""The training loop's side: the :class:`~statekeeper.loop.checkpointer.Checkpointer`, what
it holds, retention applied to a tier, resuming from the newest intact step, and the
mirror (:mod:`statekeeper.loop.mirror`)."""
