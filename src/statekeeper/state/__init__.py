"""What is captured: the state tree codec."""
