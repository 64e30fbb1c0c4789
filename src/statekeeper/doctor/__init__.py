"""statekeeper doctor: find a training state's checkpoint hazards before they cost a run.

``statekeeper.doctor.run(factory) -> Report``; rules in :mod:`statekeeper.doctor.rules`.
"""

from statekeeper.doctor.finding import Finding, Report, Severity
from statekeeper.doctor.run import run

__all__ = ["Finding", "Report", "Severity", "run"]
