"""Strict conversion between plain YAML data and config dataclasses.

Every config section (model, train, data, search) is a dataclass; `parse` checks keys, types and
choices and names the key path of the first problem, `to_plain` turns an instance back into YAML data.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Union

from blockforge.errors import SpecError, unknown_choice_message, unknown_key_message


class _Unset:
    """The default of a field whose null is a meaningful value (e.g. `window: null` means global attention)."""

    def __repr__(self) -> str:
        return "UNSET"

    def __reduce__(self):
        return "UNSET"  # pickles (and copies) as the one instance


UNSET: Any = _Unset()


def choice(*allowed: str, default: Any = dataclasses.MISSING, help: str | None = None) -> Any:
    """A string field restricted to `allowed` (the error lists them)."""
    metadata = {"choices": allowed, "help": help or "one of " + ", ".join(allowed)}
    return dataclasses.field(default=default, metadata=metadata)


def choices_of(field: dataclasses.Field) -> tuple[str, ...] | None:
    """The values a string field may take: its `choices`, a tuple or a function of none that names a registry's current
    entries (the families, the placements), so that one registered later is a choice too."""
    allowed = field.metadata.get("choices")
    return tuple(allowed()) if callable(allowed) else allowed


@dataclasses.dataclass(frozen=True)
class Range:
    """The numbers a field may hold, declared once on the field (`bounded`): the parser refuses a value outside it in one
    sentence, and the JSON Schemas editors read (blockforge/schema.py) carry it as minimum and maximum."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False  # `low` itself is outside
    high_open: bool = False
    why: str = ""  # what the value is, said before the bound: "is a fraction of the steps and "
    note: str = ""  # said after the bound, in parentheses: "one more seed gives two replicates"
    or_null: bool = False  # null is a value of the field too, and the sentence says so

    def says(self) -> str:
        """'lie in [0, 1)', 'be greater than zero', 'be at least 1', ..."""
        if self.low is not None and self.high is not None:
            return f"lie in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        if self.low is not None:
            if self.low == 0:
                return "be greater than zero" if self.low_open else "be zero or more"
            return f"be {'greater than' if self.low_open else 'at least'} {self.low:g}"
        return f"be {'below' if self.high_open else 'at most'} {self.high:g}"

    def holds(self, value: float) -> bool:
        low_ok = self.low is None or value > self.low or (value == self.low and not self.low_open)
        return low_ok and (self.high is None or value < self.high or (value == self.high and not self.high_open))

    def check(self, value: Any, path: str) -> None:
        if value is None or value is UNSET or self.holds(value):
            return
        note = f" ({self.note})" if self.note else ""
        raise SpecError(f"{self.why}must {self.says()}{note}, not {value}" + (", or null" if self.or_null else ""), path=path)


def bounded(default: Any = dataclasses.MISSING, *, above: float | None = None, at_least: float | None = None,
            below: float | None = None, at_most: float | None = None, why: str = "", note: str = "", help: str | None = None) -> Any:
    """A number field with a declared Range: `steps: int = bounded(1000, above=0)`, `alpha: float = bounded(at_least=0,
    at_most=1, help=...)` (no default: required). `why` and `note` keep a sentence of its own for the refusal."""
    rng = Range(low=above if above is not None else at_least, high=below if below is not None else at_most,
                low_open=above is not None, high_open=below is not None, why=why, note=note)
    return dataclasses.field(default=default, metadata={"range": rng, **({"help": help} if help else {})})


def check_ranges(instance: Any, path: str) -> None:
    """Refuse the first field of a dataclass instance whose value lies outside its declared Range."""
    if not dataclasses.is_dataclass(instance):
        return
    for field in dataclasses.fields(instance):
        rng = field.metadata.get("range")
        if rng is not None:
            rng.check(getattr(instance, field.name), _join(path, field.name))


def describe_type(tp: Any, plural: bool = False) -> str:
    """How an error names what `tp` accepts: 'an integer', 'a list of strings' (`plural`: 'integers')."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(describe_type(a, plural) for a in typing.get_args(tp) if a is not type(None))
    if origin in (list, tuple):
        return f"{'lists' if plural else 'a list'} of {describe_type(typing.get_args(tp)[0], plural=True)}"
    if origin is dict or dataclasses.is_dataclass(tp):
        return "mappings" if plural else "a mapping"
    names = {int: ("an integer", "integers"), float: ("a number", "numbers"), bool: ("true or false", "booleans"), str: ("a string", "strings")}
    return names[tp][plural] if tp in names else str(tp)


def _describe_value(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{value!r} ({type(value).__name__})"


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def parse_value(tp: Any, value: Any, path: str, choices: tuple[str, ...] | None = None) -> Any:
    """Check `value` against the annotation `tp` and return it converted (nested dataclasses built)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None:
            if type(None) in options:
                return None
            raise SpecError(f"must be {describe_type(tp)}, not null", path=path)
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return parse_value(option, value, path, choices)
            except SpecError as err:
                errors.append(err)
        # A mapping or list that failed deeper down reports the deeper problem, not "wrong type"; so does
        # a value of the right type that is not allowed (an unknown choice).
        deep = [e for e in errors if e.path != path or not e.message.startswith("must be")]
        if deep:
            raise deep[0]
        if len(errors) == 1:  # one kind of value allowed (besides null): its own reason ("must be a finite number")
            raise errors[0]
        raise SpecError(f"must be {describe_type(tp)}, not {_describe_value(value)}", path=path)
    if dataclasses.is_dataclass(tp):
        return parse(tp, value, path)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise SpecError(f"must be {describe_type(tp)}, not {_describe_value(value)}", path=path)
        return [parse_value(item, v, _join(path, i), choices) for i, v in enumerate(value)]
    if origin is tuple:
        item = typing.get_args(tp)[0]
        if not isinstance(value, (list, tuple)):
            raise SpecError(f"must be a list, not {_describe_value(value)}", path=path)
        return tuple(parse_value(item, v, _join(path, i), choices) for i, v in enumerate(value))
    if origin is dict:
        key_tp, item_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise SpecError(f"must be a mapping, not {_describe_value(value)}", path=path)
        return {parse_value(key_tp, k, path): parse_value(item_tp, v, _join(path, str(k))) for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise SpecError(f"must be true or false, not {_describe_value(value)}", path=path)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"must be an integer, not {_describe_value(value)}", path=path)
        return value
    if tp is float:
        # PyYAML reads `1e-3` (no dot) as a string; accept any text that is a plain number.
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise SpecError(f"must be a number, not {_describe_value(value)}", path=path) from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"must be a number, not {_describe_value(value)}", path=path)
        if not math.isfinite(value):
            raise SpecError(f"must be a finite number, not {value}", path=path)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise SpecError(f"must be a string, not {_describe_value(value)}", path=path)
        if choices is not None and value not in choices:
            raise SpecError(unknown_choice_message(value, choices), path=path)
        return value
    raise TypeError(f"unsupported annotation {tp!r} at {path}")


def parse(cls: type, data: Any, path: str = "") -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and wrong types."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"must be a mapping of keys to values, not {_describe_value(data)}", path=path)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    for key in data:
        if key not in fields:
            raise SpecError(unknown_key_message(key, fields), path=_join(path, str(key)))
    kwargs = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = parse_value(hints[name], data[name], _join(path, name), choices_of(field))
        elif field.default_factory is not dataclasses.MISSING:
            kwargs[name] = _checked(field.default_factory(), _join(path, name))  # defaults fill in like written values
        elif field.default is dataclasses.MISSING:
            raise SpecError(f"is required ({field.metadata.get('help', describe_type(hints[name]))})", path=_join(path, name))
    return _checked(cls(**kwargs), path)


def _checked(instance: Any, path: str) -> Any:
    check_ranges(instance, path)
    check = getattr(instance, "check", None)
    if check is not None:
        check(path)
    return instance


def to_plain(obj: Any) -> Any:
    """Plain YAML/JSON data (dicts, lists, scalars) for a dataclass instance, tuple or list."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if getattr(obj, f.name) is not UNSET}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def _default_of(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def canonical(obj: Any) -> Any:
    """The plain data that names what `obj` holds, stable across versions of blockforge.

    A dataclass may declare `hash_baseline` (the fields it had when its hashes were first pinned) and
    `hash_excluded` (fields that never say what it computes, such as a file-format number). A field added
    after the baseline enters only when it is set away from its default, so adding a field whose default
    keeps the old behaviour changes no existing name. Hashes built on this are pinned in tests.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        baseline = getattr(type(obj), "hash_baseline", None)
        excluded = getattr(type(obj), "hash_excluded", frozenset())
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name in excluded or value is UNSET:
                continue
            if baseline is not None and f.name not in baseline and value == _default_of(f):
                continue
            out[f.name] = canonical(value)
        return out
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    if isinstance(obj, dict):
        return {k: canonical(v) for k, v in obj.items()}
    return obj


def stable_hash(data: Any, length: int = 16) -> str:
    """A hex digest of plain data (keys sorted), the same in every process and on every machine."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()[:length]
