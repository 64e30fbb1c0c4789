"""Reading what a checkpoint holds without torch: naming and locating steps, manifests,
verifying every byte, inspecting, listing, and telling formats apart (statekeeper's and
other libraries'). Nothing here imports torch (tests/test_layers.py holds it to that)."""
