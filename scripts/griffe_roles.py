"""Griffe extension for the documentation site (mkdocs.yml): the docstrings name code with
Sphinx roles (:class:`Checkpointer`, :meth:`Checkpointer.save`, :exc:`~statekeeper.errors.
StepExistsError`); each becomes a link to the API reference when it names a public object.

A role is resolved in the scope of the docstring that holds it (as Python would resolve the
name there: the object's own members, its class, its module and that module's imports), then
mapped to its public spelling, ``statekeeper.NAME`` or ``statekeeper.NAME.member`` (the pages
under docs/reference/ document each public name once, at that identifier). It then becomes an
mkdocs-autorefs reference, ``[`Checkpointer.save`][statekeeper.Checkpointer.save]``, which the
strict build (scripts/check) fails on when nothing on the site carries that identifier.

A role that names a private helper, a module or another project (torch, safetensors...) stays
a plain code span: there is no page to link to. A role that names nothing at all, in
statekeeper or elsewhere (a typo, a name renamed or removed), is linked as
``statekeeper.<role>`` so that the strict build fails on it too.

Members without a docstring of their own (a storage backend's ``read``, a policy's
``should_save``) take the docstring of the member they implement or override in a base class
of the package, so that the reference shows what they do instead of leaving them out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import griffe

_REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference"
_DIRECTIVE = re.compile(r"^::: (statekeeper(?:\.\w+)*)\s*$", re.MULTILINE)
_ROLE = re.compile(r":(?:py:)?(attr|class|data|exc|func|meth|mod|obj):`([^`]+)`")
# projects the docstrings name that have no page on this site
_EXTERNAL = (
    "torch",
    "numpy",
    "safetensors",
    "fsspec",
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "transformers",
    "accelerate",
    "torchdata",
    "torchtitan",
    "click",
    "rich",
    "signal",
    "os",
    "pathlib",
    "typing",
    "collections",
    "dataclasses",
    "enum",
    "threading",
    "concurrent",
    "contextlib",
    "subprocess",
    "pickle",
    "warnings",
    "json",
    "io",
    "gc",
    "sys",
    "time",
    "random",
    "datetime",
    "functools",
    "xxhash",
    "boto3",
    "s3fs",
    "pytest",
    "builtins",
)


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)  # type: ignore[arg-type]


# protocols that classes implement without naming them as a base (structural typing)
_PROTOCOLS = (
    "storage.base.SharedStorage",
    "storage.base.Storage",
    "stateful.Stateful",
)


_SECTION = re.compile(r"^(?:Args|Arguments|Parameters|Returns|Yields|Raises|Attributes):\s*$", re.M)


def _renamed(base: griffe.Object, member: griffe.Object) -> str:
    """``base``'s docstring with its Args named as ``member`` names the same parameters
    (an implementation may call ``state_dict`` ``state``): matched by position."""
    text = base.docstring.value if base.docstring is not None else ""
    if not (base.is_function and member.is_function):
        return text
    ours = [p.name for p in member.parameters if p.name not in ("self", "cls")]  # type: ignore[attr-defined]
    theirs = [p.name for p in base.parameters if p.name not in ("self", "cls")]  # type: ignore[attr-defined]
    for old, new in zip(theirs, ours, strict=False):
        if old != new:
            text = re.sub(rf"^(\s+){re.escape(old)}:", rf"\g<1>{new}:", text, flags=re.M)
    return text


def _inherit_docstrings(pkg: griffe.Object) -> None:
    """A member without a docstring takes the one of the member it overrides in a base, or
    of the protocol member it implements (a class with every method of a protocol); one
    with a docstring but no Args/Returns/Raises sections gets that member's sections."""
    protocols = []
    for path in _PROTOCOLS:
        try:
            protocols.append(pkg[path])
        except Exception:  # moved or renamed: the members then show without a docstring
            continue
    for obj in _objects(pkg):
        if not obj.is_class:
            continue
        for name, member in obj.members.items():
            if name.startswith("_") or member.is_alias:
                continue
            own = member.docstring
            if own is not None and _SECTION.search(own.value):
                continue  # documented in full
            try:
                bases = list(obj.mro())  # type: ignore[attr-defined]
            except Exception:  # a base outside the package, or an unresolvable one
                bases = []
            methods = {n for n, m in obj.all_members.items() if not n.startswith("_")}
            bases += [
                p
                for p in protocols
                if p is not obj
                and {n for n, m in p.members.items() if m.is_function and not n.startswith("_")}
                <= methods
            ]
            for base in bases:
                found = base.members.get(name)
                if found is None or found.is_alias or found.docstring is None:
                    continue
                text = _renamed(found, member)
                if own is not None:  # its own text, then the sections of what it implements
                    sections = _SECTION.search(text)
                    if sections is None:
                        break
                    text = f"{own.value.rstrip()}\n\n{text[sections.start() :]}"
                member.docstring = griffe.Docstring(
                    text, parent=member, parser=found.docstring.parser
                )
                break


class SphinxRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != "statekeeper":
            return
        # the identifier each documented object has on the site: the `::: statekeeper.X`
        # directives of docs/reference/, keyed by the path of the object they name
        public: dict[str, str] = {}
        for page in sorted(_REFERENCE.glob("*.md")):
            for identifier in _DIRECTIVE.findall(page.read_text()):
                try:
                    found = pkg.modules_collection[identifier]  # type: ignore[attr-defined]
                    public[found.final_target.path if found.is_alias else found.path] = identifier
                except Exception:  # a directive griffe cannot follow: mkdocstrings says so
                    continue
        by_name: dict[str, str] = {}  # a documented name's last part -> its identifier
        for identifier in sorted(public.values(), key=len):
            by_name.setdefault(identifier.rsplit(".", 1)[-1], identifier)
        _inherit_docstrings(pkg)

        def lookup(path: str) -> griffe.Object | None:
            try:
                found = pkg.modules_collection[path]  # type: ignore[attr-defined]
                while found.is_alias:
                    found = found.target
            except Exception:
                return None
            return found  # type: ignore[no-any-return]

        def public_path(found: griffe.Object) -> str | None:
            """``statekeeper.NAME[.member]`` for an object inside a public one, else None."""
            rest: list[str] = []
            scope: griffe.Object | None = found
            while scope is not None:
                root = public.get(scope.path)
                if root is not None:
                    if not rest:
                        return root
                    # an undocumented member is not rendered (show_if_no_docstring: false)
                    return f"{root}.{'.'.join(rest)}" if found.docstring is not None else root
                rest.insert(0, scope.name)
                scope = scope.parent
            return None

        def resolve(owner: griffe.Object, text: str) -> str | None:
            """The full path the role names, in the scope of ``owner``, or None."""
            if text.startswith("statekeeper."):
                return text
            first, _, rest = text.partition(".")
            scope: griffe.Object | None = owner
            while scope is not None:
                try:
                    base = scope.resolve(first)
                except Exception:
                    scope = scope.parent
                    continue
                return f"{base}.{rest}" if rest else base
            return None

        def link(owner: griffe.Object, match: re.Match[str]) -> str:
            kind, text = match.group(1), match.group(2).strip()
            titled = re.fullmatch(r"(.+?)\s*<(.+)>", text)  # Sphinx's "title <target>"
            if titled:
                title, text = titled.group(1), titled.group(2).strip()
            short = text.startswith("~")
            text = text.lstrip("~!.")
            shown = f"`{title if titled else text.rsplit('.', 1)[-1] if short else text}`"
            if kind == "mod":
                return shown  # modules have no page of their own
            full = resolve(owner, text)
            if full is None:
                if text.split(".", 1)[0] in _EXTERNAL:
                    return shown
                # a name the docstring's module does not import: the documented public
                # object of that name, wherever its namespace is (sk.storage.Storage...)
                first, _, rest = text.partition(".")
                home = by_name.get(first)
                full = (
                    f"statekeeper.{text}" if home is None else ".".join(filter(None, (home, rest)))
                )
            if not full.startswith("statekeeper."):
                return shown  # another project's name
            found = lookup(full)
            if found is None:  # names nothing: let the strict build fail on it
                return f"[{shown}][{full}]"
            target = public_path(found)
            return shown if target is None else f"[{shown}][{target}]"  # private: no page

        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = _ROLE.sub(
                    lambda m, owner=obj: link(owner, m),  # type: ignore[misc]
                    obj.docstring.value,
                )
