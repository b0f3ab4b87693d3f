"""Typed records and their JSON form: the one codec for every file the pipeline writes (docs/layout.md).

A record is a frozen dataclass. `to_json` gives its JSON object (fields in declaration order, so a file keeps the
keys and the order it had when it was a dict) and `load_record` reads one back, checking every field's presence and
type against the declarations: a file of another shape stops with one line naming the field ("summary.json: missing
field 'claims[3].direction'"), not with a KeyError later. Readers use attributes, never string keys
(tests/test_records.py). The records of the study's summary are in rakv.experiments.summary, the benchmarks' in
rakv.bench (peer_reports, engine_report, ...), a served run's in rakv.serving.records and rakv.serving.metrics. This
module sits in the runtime, the lowest layer, so that every layer above can declare records (tests/test_config.py).

Conventions of the on-disk form, as the dicts that came before wrote it:
- a field declared with `optional()` may be left out of the file (its value is then ABSENT, which is falsy): a part
  that was not computed is not written at all, which is not the same as computed and null;
- a field's JSON name is its attribute name unless `json_name` says otherwise (a baseline name with a hyphen, a key
  with spaces);
- a statistic with its 95 % interval is a `CI` in Python, whatever its form in the file: by default the list
  `[value, low, high]`; a field declared with `ci_keys` is three keys of the record it is in (`value`, `ci_low`,
  `ci_high`), the form of the records that were rows of a table;
- a field declared with `inline()` is a record whose keys are written into the object around it (a served run's
  summary.json is one flat object of its statistics and settings);
- numbers are written as they are, numpy scalars as Python numbers; `to_json(..., nan_as_null=True)` writes NaN and
  infinity as null (summary.json; the other files keep a NaN as their dicts did, so a re-written file is the same
  bytes);
- a `dict[int, ...]` is written with its keys as strings, as JSON has it, and read back as ints.
"""

from __future__ import annotations

import enum
import json
import types
import typing
from dataclasses import MISSING, field, fields, is_dataclass
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple, get_args, get_origin, get_type_hints

import numpy as np

from rakv.runtime.errors import RakvError


class _Absent:
    """The value of an optional field that was not computed, so is left out of the JSON (falsy, like an empty part)."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


class CI(NamedTuple):
    """A statistic with its 95 % confidence interval; a bound is None (or NaN before it is written) where there is
    none. A tuple, so `value, low, high = ci` reads it too."""

    value: float | None
    low: float | None
    high: float | None


def optional():
    """A field that the JSON may lack (its value is then ABSENT)."""
    return field(default=ABSENT)


def json_name(name: str, default=MISSING):
    """A field whose JSON key is not a Python identifier ("joint-k4", "exact repeat"); `default` ABSENT: the file
    may lack it, as with `optional()`."""
    return field(default=default, metadata={"json": name})


def ci_keys(value: str, low: str, high: str):
    """A `CI` field written as three keys of its record, in this order (the value's, the low bound's, the high's)."""
    return field(metadata={"ci_keys": (value, low, high)})


def inline():
    """A record field whose own fields are written as keys of the enclosing object (no object of its own)."""
    return field(metadata={"inline": True})


def name_of(f) -> str:
    """A field's name in the JSON."""
    return f.metadata.get("json", f.name)


@cache
def _hints(cls) -> dict:
    return get_type_hints(cls)


def record_items(record) -> list[tuple[str, object]]:
    """(name in the JSON, value) of every key a record writes, in order (absent fields left out; a `ci_keys` field
    as its three keys, an `inline` record as its own keys)."""
    items = []
    for f in fields(record):
        value = getattr(record, f.name)
        if value is ABSENT:
            continue
        if "ci_keys" in f.metadata:
            items += zip(f.metadata["ci_keys"], value)
        elif f.metadata.get("inline"):
            items += record_items(value)
        else:
            items.append((name_of(f), value))
    return items


def to_json(value, nan_as_null: bool = False):
    """`value` (a record, or a part of one) as JSON-ready data: records as objects in field order, absent fields left
    out, maps with their keys as strings, numpy scalars as Python numbers; with `nan_as_null` NaN and infinity as
    None."""
    if is_dataclass(value) and not isinstance(value, type):
        return {name: to_json(v, nan_as_null) for name, v in record_items(value)}
    if isinstance(value, dict):
        return {str(k): to_json(v, nan_as_null) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v, nan_as_null) for v in value]
    if isinstance(value, (float, np.floating)):
        return None if nan_as_null and not np.isfinite(value) else float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


class SchemaError(ValueError):
    """A value that does not fit its declaration; the message names the field by its path (claims[3].verdict)."""


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


SCALARS = {float: _number, int: lambda v: _number(v) and float(v).is_integer(), str: lambda v: isinstance(v, str),
           bool: lambda v: isinstance(v, bool)}


def _bound(value, where: str):
    if not (value is None or _number(value)):
        raise SchemaError(f"field '{where}' is not a float (found {type(value).__name__} {value!r:.40})")
    return value


def _check(hint, value, where: str):
    """`value` as the type `hint` declares it, checked; records built from objects, lists and maps element-wise."""
    if hint is Any:
        return value
    if hint in (dict, list):  # a part in another program's own format (vLLM's speculative_config)
        if not isinstance(value, hint):
            raise SchemaError(f"field '{where}' is not a {hint.__name__}")
        return value
    if hint is CI:
        if not (isinstance(value, list) and len(value) == 3 and all(v is None or _number(v) for v in value)):
            raise SchemaError(f"field '{where}' is not an interval [value, low, high]")
        return CI(*value)
    origin = get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in get_args(hint) if a is not type(None)]
        if value is None and len(options) < len(get_args(hint)):
            return None
        return _check(options[0], value, where)
    if is_dataclass(hint):
        return _record(hint, value, where)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):  # a vocabulary (rakv.experiments.verdicts)
        if not isinstance(value, str) or value not in {m.value for m in hint}:
            raise SchemaError(f"field '{where}' is not one of {', '.join(m.value for m in hint)} (found {value!r:.40})")
        return hint(value)
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise SchemaError(f"field '{where}' is not a list")
        if not get_args(hint):
            return value
        checked = [_check(get_args(hint)[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
        return checked if origin is list else tuple(checked)
    if origin is dict:
        if not isinstance(value, dict):
            raise SchemaError(f"field '{where}' is not an object")
        key, item = get_args(hint)
        return {_key(key, k, where): _check(item, v, f"{where}.{k}") for k, v in value.items()}
    if not SCALARS[hint](value):
        raise SchemaError(f"field '{where}' is not a {hint.__name__} (found {type(value).__name__} {value!r:.40})")
    return value


def _key(kind, key: str, where: str):
    if kind is int:
        if not key.lstrip("-").isdigit():
            raise SchemaError(f"field '{where}' has a key '{key}' that is not an integer")
        return int(key)
    return key


@cache
def json_keys(cls) -> tuple[str, ...]:
    """Every key an object of record `cls` may have, in order (`ci_keys` and `inline` fields expanded)."""
    keys: list[str] = []
    for f in fields(cls):
        if "ci_keys" in f.metadata:
            keys += f.metadata["ci_keys"]
        elif f.metadata.get("inline"):
            keys += json_keys(_hints(cls)[f.name])
        else:
            keys.append(name_of(f))
    return tuple(keys)


def _record(cls, data, where: str, inlined: bool = False):
    if not isinstance(data, dict):
        raise SchemaError(f"field '{where or cls.__name__}' is not an object")
    if not inlined:  # an inline record's object is the enclosing one's, checked there
        known = set(json_keys(cls))
        unknown = sorted(set(data) - known)
        if unknown:
            raise SchemaError(f"unknown field '{where}.{unknown[0]}'" if where else f"unknown field '{unknown[0]}'")
    values = {}
    for f in fields(cls):
        if "ci_keys" in f.metadata:
            bounds = []
            for name in f.metadata["ci_keys"]:
                path = f"{where}.{name}" if where else name
                if name not in data:
                    raise SchemaError(f"missing field '{path}'")
                bounds.append(_bound(data[name], path))
            values[f.name] = CI(*bounds)
            continue
        if f.metadata.get("inline"):
            values[f.name] = _record(_hints(cls)[f.name], data, where, inlined=True)
            continue
        name = name_of(f)
        path = f"{where}.{name}" if where else name
        if name not in data:
            if f.default is ABSENT:
                continue
            raise SchemaError(f"missing field '{path}'")
        values[f.name] = _check(_hints(cls)[f.name], data[name], path)
    return cls(**values)


def from_json(cls, data):
    """A record of type `cls` from its JSON form; SchemaError (a ValueError) naming the first field that does not
    fit. For a part of a file whose errors the caller words itself (a line of a .jsonl file)."""
    return _record(cls, data, "")


def load_record(cls, data, source: str):
    """A record of type `cls` from its JSON form (`source` names the file or stream in the error)."""
    try:
        return _record(cls, data, "")
    except SchemaError as exc:
        raise RakvError(f"{source}: {exc}") from None


def check_part(hint, value, where: str, source: str):
    """One part of a file (`where`: its path) as the type `hint` declares it, for a reader that takes only some
    parts of a file of any version (rakv.experiments.summary.read_engine_facts)."""
    try:
        return _check(hint, value, where)
    except SchemaError as exc:
        raise RakvError(f"{source}: {exc}") from None


def read_json(path: Path, when_missing: str = ""):
    """The parsed JSON file at `path`; RakvError naming the file where it is missing (`when_missing`: what to run)
    or not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise RakvError(f"{path} is missing" + (f": {when_missing}" if when_missing else "")) from None
    except ValueError as exc:
        raise RakvError(f"{path}: not JSON ({exc})") from None


def read_record(cls, path: Path, when_missing: str = ""):
    """The JSON file at `path` as a record of type `cls` (RakvError naming the file and the first bad field)."""
    return load_record(cls, read_json(path, when_missing), str(path))


def write_record(record, path: Path, indent: int | None = 1) -> Path:
    """`record` as JSON at `path` (its folder made), as the scripts wrote their dicts (`indent` 1)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(record), indent=indent))
    return path
