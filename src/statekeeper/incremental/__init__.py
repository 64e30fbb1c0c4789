"""Incremental saves: a shard that is byte for byte a file of an earlier step is reused
(:mod:`.reuse`), from what a process remembers of tensors between saves (:mod:`.marks`)."""
