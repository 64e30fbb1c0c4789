"""The statekeeper command line."""
