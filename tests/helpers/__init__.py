"""Programs the tests run in subprocesses, and the fork servers that start them cheaply."""
