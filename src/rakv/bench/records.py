"""The benchmarks' reports as typed records, and their JSON form (docs/layout.md, `bench`).

Every report a benchmark writes or prints as JSON (scripts/bench_engine.py --json, scripts/bench_serving.py --out,
scripts/bench_vllm_serve.py's summary.json, scripts/tune_vllm.py's tune.json, the vLLM peer's result files) is a
frozen dataclass; `to_json` gives the JSON object (fields in declaration order, so a file keeps the keys and order
it had when it was a dict) and `load_record` reads one back, checking every field's presence and type against the
declarations: a shipped file of another shape stops with one line naming the field ("bench_serving/ar.json:
missing field 'rows[2].concurrency'"), not with a KeyError later. Readers use attributes, never string keys.

Conventions of the on-disk form, as the dicts that came before wrote it:
- a field declared with `optional()` may be left out of the file (its value is then ABSENT, which is falsy): a part
  that was not measured (no vLLM row at this c, no bound without a compact model) is not written at all;
- a field's JSON name is its attribute name unless `json_name` says otherwise (a key with spaces);
- numbers are written as they are (no NaN is turned into null: a re-written file is the same bytes);
- a `dict[int, ...]` is written with its keys as strings, as JSON has it, and read back as ints.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import field, fields, is_dataclass
from functools import cache
from pathlib import Path
from typing import Any, NewType, get_args, get_origin, get_type_hints

from rakv.runtime.errors import RakvError

Interval = NewType("Interval", list)  # [value, low, high]: a statistic with its 95 % CI (None: no bound)


class _Absent:
    """The value of an optional field that was not measured, so is left out of the JSON (falsy)."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


def optional():
    """A field that the JSON may lack (its value is then ABSENT)."""
    return field(default=ABSENT)


def json_name(name: str, default=ABSENT):
    """A field whose JSON key is not a Python identifier ("exact repeat")."""
    return field(default=default, metadata={"json": name})


def name_of(f) -> str:
    return f.metadata.get("json", f.name)


def to_json(value):
    """`value` (a record, or a part of one) as JSON-ready data: records as objects in field order, absent fields
    left out, maps with their keys as strings."""
    if is_dataclass(value) and not isinstance(value, type):
        return {name_of(f): to_json(getattr(value, f.name)) for f in fields(value)
                if getattr(value, f.name) is not ABSENT}
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


class SchemaError(Exception):
    """A value that does not fit its declaration; the message names the field by its path (rows[3].concurrency)."""


@cache
def _hints(cls) -> dict:
    return get_type_hints(cls)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


SCALARS = {float: _number, int: lambda v: _number(v) and float(v).is_integer(), str: lambda v: isinstance(v, str),
           bool: lambda v: isinstance(v, bool)}


def _check(hint, value, where: str):
    """`value` as the type `hint` declares it, checked; records built from objects, lists and maps element-wise."""
    if hint is Any:
        return value
    if hint in (dict, list):  # a part in another program's own format (vLLM's speculative_config)
        if not isinstance(value, hint):
            raise SchemaError(f"field '{where}' is not a {hint.__name__}")
        return value
    if hint is Interval:
        if not (isinstance(value, list) and len(value) == 3 and all(v is None or _number(v) for v in value)):
            raise SchemaError(f"field '{where}' is not an interval [value, low, high]")
        return value
    origin = get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in get_args(hint) if a is not type(None)]
        if value is None and len(options) < len(get_args(hint)):
            return None
        return _check(options[0], value, where)
    if is_dataclass(hint):
        return _record(hint, value, where)
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


def _record(cls, data, where: str):
    if not isinstance(data, dict):
        raise SchemaError(f"field '{where or cls.__name__}' is not an object")
    known = {name_of(f): f for f in fields(cls)}
    unknown = [k for k in data if k not in known]
    if unknown:
        raise SchemaError(f"unknown field '{where}.{unknown[0]}'" if where else f"unknown field '{unknown[0]}'")
    values = {}
    for name, f in known.items():
        path = f"{where}.{name}" if where else name
        if name not in data:
            if f.default is ABSENT:
                continue
            raise SchemaError(f"missing field '{path}'")
        values[f.name] = _check(_hints(cls)[f.name], data[name], path)
    return cls(**values)


def load_record(cls, data, source: str):
    """A record of type `cls` from its JSON form (`source` names the file or stream in the error)."""
    try:
        return _record(cls, data, "")
    except SchemaError as exc:
        raise RakvError(f"{source}: {exc}") from None


def read_record(cls, path: Path):
    """The JSON file at `path` as a record of type `cls` (RakvError naming the file and the first bad field)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise RakvError(f"{path} is missing") from None
    except ValueError as exc:
        raise RakvError(f"{path}: not JSON ({exc})") from None
    return load_record(cls, data, str(path))


def write_record(record, path: Path, indent: int | None = 1) -> Path:
    """`record` as JSON at `path` (its folder made), as the scripts wrote their dicts (`indent` 1)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(record), indent=indent))
    return path
