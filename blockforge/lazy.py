"""Names imported when they are first used, so that `import blockforge`, the command line and a family's declarations
import no torch, Ray or transformers until something needs them.

- `exports(package, names)`: a package's module `__getattr__` and `__dir__` (PEP 562). `blockforge.build_model` imports
  blockforge.nn.build at its first use, and `blockforge.search` imports that package, as an eager import did.
- `lazy("module:name")`: one object (a function, a class, an `ExportFormat`) named by where it lives. Calling it calls
  the object and reading an attribute reads the object's, both after importing the module once; a family registers its
  hooks this way (families/llama.py), so its names, fields and defaults cost nothing to import.

Imports nothing of blockforge.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any, Callable


def exports(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package` for `names` (name -> the module that defines it). A name is imported
    from its module on first use and kept in the package, so later reads are plain attribute reads; a name that is not
    in `names` but is a submodule of the package (`blockforge.search`) is imported as that submodule."""

    def __getattr__(name: str) -> Any:
        module = sys.modules[package]
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
        elif not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__


class lazy:  # lower case: it reads as a function where a family names a hook, lazy("blockforge.nn.llama:Llama")
    """An object named by `"module:name"`, imported when it is first called or one of its attributes is read."""

    __slots__ = ("target",)

    def __init__(self, target: str) -> None:
        if target.count(":") != 1:
            raise ValueError(f"lazy({target!r}): name it as 'module:name'")
        self.target = target

    def resolve(self) -> Any:
        """The object itself (its module imported once; Python keeps it)."""
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "target":  # not the object's: pickling and copying ask for these
            raise AttributeError(name)
        return getattr(self.resolve(), name)

    def __repr__(self) -> str:
        return f"lazy({self.target!r})"
