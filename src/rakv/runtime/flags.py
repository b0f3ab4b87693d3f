"""The command line's flags, generated from the options' dataclasses: an option is declared once, as a field.

A field that is a flag carries `field(metadata={"help": ...})`, and where it needs them: `flag` (its name when it
is not --field-name, e.g. --goodput, --memory-penalty, --no-draft-reuse), `metavar`, `choices`, `nargs`, and
`parse` (from the flag's text to the field's value, raising a one-line RakvError; e.g. "0,1,2" -> (0, 1, 2)).
Its default comes from `defaults` (conf/, the one source of default values: ServeOptions' conf/serving,
ControllerConfig's conf/controller, EngineOptions' conf/config.yaml and conf/cache, TraceOptions' conf/serving
`trace:`), else from the field itself;
a field with neither is a required flag. The help ends with the default unless it is None or the help already
names it. A bool is a switch: --name (sets it) when its default is false, --no-name when it
is true; a switch named --no-... always clears it. The dataclass's own checks (its __post_init__) stay the one
place values are validated.
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Mapping
from dataclasses import MISSING, Field, fields
from types import NoneType, UnionType


def flag_fields(cls: type, names: tuple[str, ...]) -> list[Field]:
    by_name = {f.name: f for f in fields(cls)}
    return [by_name[name] for name in names]


def default_of(spec: Field, defaults: Mapping | None):
    """The flag's default: `defaults`' value, else the field's; None for a field built by a factory (its `parse`
    makes the value of an absent flag, e.g. no --goodput: no SLOs); MISSING: none (a required flag)."""
    if defaults is not None and spec.name in defaults:
        return defaults[spec.name]
    return None if spec.default_factory is not MISSING else spec.default


def scalar_type(cls: type, name: str):
    """int, float or str for `int`, `float | None`, ...; None for a bool or a type a `parse` reads."""
    kind = typing.get_type_hints(cls)[name]
    if isinstance(kind, UnionType) or typing.get_origin(kind) is typing.Union:
        kind = next(k for k in typing.get_args(kind) if k is not NoneType)
    return kind if kind in (int, float, str, bool) else None


def add_flags(parser, cls: type, names: tuple[str, ...], defaults: Mapping | None = None,
              hidden: tuple[str, ...] = ()) -> None:
    """One flag per field in `names` (in that order) on `parser` (or an argument group); `hidden` ones work but are
    left out of --help."""
    for spec in flag_fields(cls, names):
        meta, default = spec.metadata, default_of(spec, defaults)
        kind = scalar_type(cls, spec.name)
        name = meta.get("flag") or "--" + spec.name.replace("_", "-")
        extra = {key: meta[key] for key in ("metavar", "choices", "nargs") if key in meta}
        if kind is bool:
            if "flag" not in meta and default:
                name = "--no-" + spec.name.replace("_", "-")
            # the flag's name says what it does: --no-x always switches x off, whatever conf's default is
            extra["action"] = "store_false" if name.startswith("--no-") else "store_true"
        elif "parse" not in meta:
            extra["type"] = kind
        if isinstance(default, (list, tuple)):  # typed as a comma-separated list, read by `parse`
            default = ",".join(map(str, default))
        help_text = meta["help"]
        if kind is not bool and default not in (MISSING, None) and "(default" not in help_text:
            help_text += " (default %(default)s)"
        if default is MISSING:
            extra["required"] = True
        else:
            extra["default"] = default
        parser.add_argument(name, dest=spec.name, help=argparse.SUPPRESS if spec.name in hidden else help_text,
                            **extra)


def flag_values(args: argparse.Namespace, cls: type, names: tuple[str, ...]) -> dict:
    """The fields in `names` from parsed flags, each through its `parse` (if any): keyword arguments for `cls`."""
    values = {}
    for spec in flag_fields(cls, names):
        value = getattr(args, spec.name)
        values[spec.name] = spec.metadata["parse"](value) if "parse" in spec.metadata else value
    return values
