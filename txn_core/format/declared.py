"""Record kinds declared once: a frozen dataclass whose fields carry their JSON codecs gives its JSON form,
its parser and (with a ``kind`` discriminator) its dispatch (pyiceberg's table updates, Delta's actions).

A field is declared with :func:`jfield` and a :class:`Codec`: ``dump`` turns the value into JSON (or
:data:`OMIT`: the field is left out), ``load`` checks and converts what was read. A field with a default may
be absent when read (it then takes the default); one without may not. Adding a field is one line, and a
misspelled or missing field is an error naming it, never a silent ``None``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self, TypeVar

from txn_core.format.ids import TxnId

#: What :meth:`Codec.dump` returns for a field that is left out of the JSON form.
OMIT: Any = object()

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Codec:
    """How one field is written to JSON and read back (``load`` raises ValueError/TypeError when invalid)."""

    dump: Callable[[Any], Any]
    load: Callable[[Any], Any]


def _omit_none(dump: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: OMIT if v is None else dump(v)


def _flag(value: object) -> bool:
    if value is not True:
        raise ValueError(f"expected true or nothing, got {value!r}")
    return True


#: A string.
STR = Codec(_omit_none(str), str)
#: An integer (read leniently with ``int()``, as records always were).
INT = Codec(_omit_none(int), int)
#: A transaction id, in its one spelling (``c:s`` or ``c:s.i``).
TXN = Codec(_omit_none(str), TxnId.parse)
#: A list of strings, held as a tuple.
STRS = Codec(_omit_none(list), lambda v: tuple(str(p) for p in v))
#: A flag: ``true``, or absent (held as None).
FLAG = Codec(lambda v: True if v else OMIT, _flag)
#: Any JSON value, kept as read.
ANY = Codec(_omit_none(lambda v: v), lambda v: v)


def one_of(*allowed: str) -> Codec:
    """A string that must be one of ``allowed``."""

    def load(value: Any) -> str:
        if value not in allowed:
            raise ValueError(f"{value!r} is not one of {', '.join(allowed)}")
        return str(value)

    return Codec(_omit_none(str), load)


def checked_int(check: Callable[[int], bool], what: str) -> Codec:
    """An int (not a bool) for which ``check`` holds; ``what`` describes the rule in errors."""

    def load(value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not check(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return Codec(_omit_none(int), load)


def jfield(codec: Codec, default: Any = dataclasses.MISSING, *, key: str | None = None) -> Any:
    """A declared field: its codec, its default when it may be absent, and ``key``, its name in the JSON
    form when that is not the field's (a stored name kept for compatibility under a clearer one)."""
    return dataclasses.field(default=default, metadata={"codec": codec, "key": key})


def _key(f: dataclasses.Field[Any]) -> str:
    return f.metadata["key"] or f.name


class Declared:
    """Base of declared record kinds: ``to_json`` and ``from_json`` follow from the fields (module doc). A
    kind with a discriminator sets ``kind`` and ``discriminator`` (the JSON key naming it, written first)."""

    kind: ClassVar[str] = ""
    discriminator: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {self.discriminator: self.kind} if self.discriminator else {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = f.metadata["codec"].dump(getattr(self, f.name))
            if value is not OMIT:
                out[_key(f)] = value
        return out

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Self:
        """The record of ``value``; KeyError, TypeError or ValueError (naming the field) when invalid."""
        args: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            key = _key(f)
            if key in value:
                try:
                    args[f.name] = f.metadata["codec"].load(value[key])
                except (TypeError, ValueError) as exc:
                    raise type(exc)(f"field {key!r}: {exc}") from exc
            elif f.default is dataclasses.MISSING:
                raise KeyError(key)
        return cls(**args)
