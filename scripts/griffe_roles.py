"""Griffe extension for the documentation site (mkdocs.yml): the docstrings name code with
Sphinx roles (:class:`Checkpointer`, :func:`save`); show those as plain code spans."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:attr|class|data|exc|func|meth|mod|obj):(`[^`]+`)")


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(r"\1", obj.docstring.value)
