"""Secrets in a command line, replaced before the manifest records it.

What is redacted (the value only; the option's name stays, so the command reads as run):

- the value of an option whose name ends in a secret word, given as ``--token VALUE`` or
  ``--token=VALUE``: ``token``, ``password``, ``passwd``, ``passphrase``, ``secret``,
  ``credential(s)``, ``apikey``, or ``key`` after another word (``--api-key``,
  ``--access-key``, ``--hf-token``, ``--db-password``; a bare ``--key`` is not);
- the value of an assignment ``NAME=VALUE`` whose name ends so (``HF_TOKEN=...``,
  ``OPENAI_API_KEY=...``, ``trainer.wandb.api_key=...``);
- the password of a URL with credentials, anywhere in an argument (``https://user:PASS@host``);
- values shaped like well-known access tokens, anywhere (Hugging Face ``hf_...``, GitHub
  ``ghp_...`` / ``github_pat_...``, ``sk-...`` API keys, AWS access key ids, Slack ``xox.-``).

This is a guard for the common cases, not a proof: a secret in a positional argument of no
known shape stays. Pick ``Origin.MINIMAL`` (no command line at all) for such jobs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["REDACTED", "redact_argv"]

REDACTED = "[redacted]"

_WORDS = frozenset(
    {"token", "password", "passwd", "passphrase", "secret", "credential", "credentials",
     "apikey", "accesskey", "secretkey", "privatekey"}
)  # fmt: skip
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*):[^/@\s]*@")
_TOKEN_SHAPES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|ghp_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,})"
)
_ASSIGNMENT = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)=")


def _secret_name(name: str) -> bool:
    """Whether an option or variable called ``name`` holds a secret (its last word)."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    if not words:
        return False
    last = words[-1]
    return last in _WORDS or (last == "key" and len(words) > 1)


def _scrub(text: str) -> str:
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}:{REDACTED}@", text)
    return _TOKEN_SHAPES.sub(REDACTED, text)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with the values of secret-looking options and assignments, URL passwords and
    token-shaped values replaced by ``[redacted]``; the program name and everything else
    as given."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("--"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        if arg.startswith("-") and "=" not in arg:
            hide_next = _secret_name(arg)
            out.append(arg)
            continue
        found = _ASSIGNMENT.match(arg.lstrip("-"))
        if found is not None and _secret_name(found["name"]):
            cut = len(arg) - len(arg.lstrip("-")) + found.end()
            out.append(arg[:cut] + REDACTED)
            continue
        out.append(_scrub(arg))
    return out
