"""A griffe extension: docstrings completed at import time are rendered as Python holds them.

`gradtx._transforms.shared_args.with_shared_args` adds the shared `Args:` entries to a
function's docstring when its module is imported. Griffe reads the source; once it has
loaded the package, this takes each module-level function's docstring from the imported
function where the two differ.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe


class RuntimeDocstrings(griffe.Extension):
    """Module-level functions of gradtx get the docstrings of the imported functions."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name == "gradtx":
            self._visit(pkg)

    def _visit(self, module: griffe.Module) -> None:
        runtime = importlib.import_module(module.path)
        for name, member in module.members.items():
            if member.is_alias:
                continue
            if member.is_module:
                self._visit(member)
            elif member.is_function and member.docstring is not None:
                doc = inspect.getdoc(getattr(runtime, name, None))
                if doc and doc != member.docstring.value:
                    member.docstring.value = doc
