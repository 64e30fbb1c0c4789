"""save, load, read, listing: the checkpoint pipeline over a Storage."""
