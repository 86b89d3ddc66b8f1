"""YAML read strictly: what PyYAML's safe_load accepts silently but no spec means is one SpecError.

- A key given twice in one mapping (safe_load keeps the last one without a word).
- A plain scalar YAML 1.1 reads as a base-60 number: `at: 1:3` is 63, not the slice '1:3'.
- Anchors and aliases that refer to themselves, or expand to more values than any spec holds.

Every recipe, search file and spec.yaml is read through `read_yaml`; `--set` values through `load_text`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from blockforge.errors import SpecError

INT_TAG = "tag:yaml.org,2002:int"
FLOAT_TAG = "tag:yaml.org,2002:float"
STR_TAG = "tag:yaml.org,2002:str"
MERGE_TAG = "tag:yaml.org,2002:merge"
MAX_VALUES = 1_000_000  # far above any spec; an alias bomb expands to billions


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _is_base_60(node: yaml.ScalarNode) -> bool:
    return node.style is None and node.tag in (INT_TAG, FLOAT_TAG) and ":" in node.value


class _Checker:
    """Walks a composed YAML document once, before anything is constructed from it."""

    def __init__(self, loader: yaml.SafeLoader, base_60_as_text: bool):
        self.loader = loader
        self.base_60_as_text = base_60_as_text
        self.sizes: dict[int, int | None] = {}  # node id -> values it expands to (None while being walked)

    def walk(self, node: yaml.Node, path: str) -> int:
        known = self.sizes.get(id(node), -1)
        if known is None:
            raise SpecError("refers to itself through an alias; write the value out", path=path)
        if known >= 0:  # an alias of a node already checked
            return known
        self.sizes[id(node)] = None
        if isinstance(node, yaml.ScalarNode):
            size = 1
            self.scalar(node, path)
        elif isinstance(node, yaml.SequenceNode):
            size = 1 + sum(self.walk(child, _join(path, i)) for i, child in enumerate(node.value))
        else:
            size = 1 + self.mapping(node, path)
        if size > MAX_VALUES:
            raise SpecError(f"expands to more than {MAX_VALUES:,} values through anchors and aliases; write the values out", path=path)
        self.sizes[id(node)] = size
        return size

    def scalar(self, node: yaml.ScalarNode, path: str) -> None:
        if not _is_base_60(node):
            return
        if self.base_60_as_text:  # a --set value: the user's text, exactly
            node.tag = STR_TAG
            return
        number = self.loader.construct_object(node)
        key = path.rsplit(".", 1)[-1]
        written = f"'{node.value}'" if not key or key.endswith("]") else f"{key}: '{node.value}'"
        raise SpecError(
            f"line {node.start_mark.line + 1}: {node.value} is read by YAML 1.1 as the base-60 number {number}; quote it: {written}",
            path=path,
        )

    def mapping(self, node: yaml.MappingNode, path: str) -> int:
        size = 0
        first_line: dict[Any, int] = {}
        for key_node, value_node in node.value:
            size += self.walk(key_node, path)
            if key_node.tag == MERGE_TAG:  # `<<: *base` keys may be overridden; that is what merging is for
                size += self.walk(value_node, path)
                continue
            key = self.loader.construct_object(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            where = _join(path, str(key)) if key is not None else path
            line = key_node.start_mark.line + 1
            try:
                if key is not None and key in first_line:
                    raise SpecError(f"line {line}: '{key}' is given twice in one mapping (first on line {first_line[key]}); keep one of them",
                                    path=where)
                first_line[key] = line
            except TypeError:  # an unhashable key: PyYAML's constructor reports it
                pass
            size += self.walk(value_node, where)
        return size


def load_text(text: str, *, file: str | None = None, base_60_as_text: bool = False) -> Any:
    """The data of one YAML document, checked; raises SpecError (file, line, key path) or yaml.YAMLError."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            _Checker(loader, base_60_as_text).walk(node, "")
        except SpecError as err:
            raise err.located(file) from None
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml(path: str | os.PathLike) -> Any:
    """A YAML file's data, read strictly; a missing file, a syntax error or a check is one SpecError sentence."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError("file not found; check the path", file=str(path)) from None
    except IsADirectoryError:
        raise SpecError("is a folder, not a YAML file", file=str(path)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(f"cannot be read ({err.__class__.__name__}: {err})", file=str(path)) from None
    try:
        return load_text(text, file=str(path))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SpecError(f"is not valid YAML ({where}{problem}); fix the syntax there", file=str(path)) from None
    except RecursionError:
        raise SpecError("nests lists or mappings too deeply to be a spec; flatten it", file=str(path)) from None
