"""A griffe extension for the guide's reference (mkdocs.yml): gnl's docstrings use Sphinx roles
(``:class:`Worker```, ``:func:`gnl.enqueue_many```), which read well in ``help()`` but are not
Markdown. This rewrites each role into a mkdocstrings cross-reference when it names something
gnl exports (``[`Worker`][gnl.Worker]``; a broken one fails ``mkdocs build --strict``), and into
plain code otherwise (``importlib.resources.files``, private modules)."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj):`~?(?P<target>[^`]+)`")


class SphinxRoles(griffe.Extension):
    """Rewrites Sphinx roles in the docstrings of the ``gnl`` package."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "gnl":
            return
        exported = set(pkg.exports or ())

        def rewrite(match: re.Match[str]) -> str:
            target = match["target"].removeprefix("gnl.")
            if target.split(".")[0] in exported:
                return f"[`{target}`][gnl.{target}]"
            return f"`{match['target']}`"

        def visit(obj: griffe.Object) -> None:
            if obj.docstring is not None:
                obj.docstring.value = _ROLE.sub(rewrite, obj.docstring.value)
            for member in obj.members.values():
                if not member.is_alias:
                    visit(member)  # type: ignore[arg-type]

        visit(pkg)
