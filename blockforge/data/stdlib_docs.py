"""Extract the built-in corpus: the documentation the Python standard library carries with it.

Documents are the docstrings of stdlib modules, of their public classes and functions and of those
classes' public methods and attributes, followed by the topics of `pydoc_data.topics` (the text behind
`help('FORMATTING')`, ...). Whitespace is normalised with inspect.cleandoc, exact duplicates keep their
first occurrence, and everything is visited in sorted order, so two runs on the same Python give the
same list.

This file is a script run in a separate interpreter (see corpus.builtin_documents), never imported by
blockforge: importing hundreds of modules is slow, some of them print or warn, and none of them should
stay loaded in the training process. It depends on the standard library only.

    python -S -B stdlib_docs.py OUT.json
"""

import importlib
import inspect
import json
import pkgutil
import sys
import warnings

# Never imported: importing them opens a browser, prints, starts a GUI or runs a demo, or they are
# the test suites and IDE, whose docstrings are not documentation; lib2to3 may write grammar pickles
# into the stdlib folder when it is imported.
SKIPPED_MODULES = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "lib2to3"}
# Submodule names never descended into, at any depth (test packages, `python -m` entry points).
SKIPPED_SUBMODULES = {"test", "tests", "idle_test", "__main__"}
# Packages whose submodules are generated boilerplate (one codec per module): only the package is read.
NO_SUBMODULES = {"encodings"}
# Shorter docstrings are labels ("Alias for field number 0."), not prose.
MIN_CHARS = 20


def try_import(name):
    """The module, or None when importing it fails or tries to exit (e.g. Windows-only modules)."""
    try:
        return importlib.import_module(name)
    except (Exception, SystemExit):
        return None


def stdlib_modules():
    """Public stdlib modules (top level and, recursively, submodules) that import cleanly, by name."""
    modules = {}

    def visit(name):
        module = try_import(name)
        if module is None:
            return
        modules[name] = module
        if name in NO_SUBMODULES or not hasattr(module, "__path__"):
            return
        for info in pkgutil.iter_modules(module.__path__):
            if not info.name.startswith("_") and info.name not in SKIPPED_SUBMODULES:
                visit(f"{name}.{info.name}")

    for name in sorted(sys.stdlib_module_names):
        if not name.startswith("_") and name not in SKIPPED_MODULES:
            visit(name)
    return dict(sorted(modules.items()))


def is_documented_member(value):
    descriptors = (property, classmethod, staticmethod)
    return inspect.isroutine(value) or isinstance(value, descriptors) or inspect.isgetsetdescriptor(value)


def public_items(namespace):
    return sorted((name, value) for name, value in namespace.items() if not name.startswith("_"))


def module_docstrings(module):
    """The module's docstring, then each public class (with its members) and function, by name."""
    yield module.__doc__
    for _, value in public_items(vars(module)):
        if inspect.isclass(value):
            yield value.__doc__
            for _, member in public_items(vars(value)):
                if is_documented_member(member):
                    yield getattr(member, "__doc__", None)
        elif inspect.isroutine(value):
            yield value.__doc__


def extract():
    docstrings = [doc for module in stdlib_modules().values() for doc in module_docstrings(module)]
    from pydoc_data.topics import topics

    documents = {}  # dict: ordered and deduplicated
    for text in docstrings + [topics[key] for key in sorted(topics)]:
        if isinstance(text, str):
            text = inspect.cleandoc(text)
            if len(text) >= MIN_CHARS:
                documents.setdefault(text, None)
    return list(documents)


if __name__ == "__main__":
    warnings.simplefilter("ignore")  # deprecated modules warn on import; the caller captures output anyway
    documents = extract()
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump(documents, f, ensure_ascii=False)
