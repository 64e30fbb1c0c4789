"""statekeeper doctor: find a training state's checkpoint hazards before they cost a run."""
