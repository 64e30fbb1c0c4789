"""Programs the tests run in subprocesses."""
