"""fsspec ``storage_options`` from flat, dotted option names (Spark's ``storage.<key>`` options, the CLI's
``-o KEY=VALUE``): ``client_kwargs.endpoint_url=URL`` -> ``{"client_kwargs": {"endpoint_url": URL}}``.

How a value is decoded is the caller's rule (each surface documents its own); only the nesting is shared.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from txn_core.errors import ConfigurationError


def nest_storage_options(
    items: Iterable[tuple[str, Any]], *, prefix: str = "", error: type[ConfigurationError] = ConfigurationError
) -> dict[str, Any]:
    """Nest dotted names into a dict, in name order. ``prefix`` is how the user wrote the names (for
    messages). Raises ``error`` naming the option for an empty name part or a name that nests under one
    already given a value."""
    out: dict[str, Any] = {}
    for name, value in sorted(items, key=lambda item: item[0]):
        *parents, leaf = name.split(".")
        if not leaf or not all(parents):
            raise error(f"bad storage option name '{prefix}{name}': use {prefix}<name>[.<sub-name>]")
        node = out
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise error(
                    f"storage option '{prefix}{name}' conflicts with '{prefix}{part}', which is already a value"
                )
            node = child
        node[leaf] = value
    return out
