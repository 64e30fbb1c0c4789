"""Bytes and names only (no torch): the Storage protocol and its backends."""
