"""Output for the ``txnlog`` command line: tables for people, JSON for scripts, progress bars on stderr.

Tables are plain fixed-width text (numbers right-aligned, long cells cut with ``…``). JSON is one document
per command (``dump`` writes JSON lines); :func:`to_jsonable` turns Arrow/Python values into JSON values.
:class:`Progress` draws a bar on stderr only when stderr is a terminal, and only once an operation has run
for longer than half a second, so scripts and quick commands never see it.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import IO, Any

#: Cells longer than this are cut (``…``) in tables; JSON output is never cut.
MAX_CELL = 48


# --- values ------------------------------------------------------------------------------------


def to_jsonable(value: Any) -> Any:
    """``value`` as a JSON value: datetimes as ISO-8601, bytes as base64, decimals as strings, and the
    floats JSON cannot hold (RFC 8259 has no NaN or infinity) as the strings ``"NaN"``, ``"Infinity"`` and
    ``"-Infinity"``, the spelling of Spark's and Jackson's JSON readers."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dt.datetime):
        if value.tzinfo and not value.microsecond % 1000 and not getattr(value, "nanosecond", 0):
            return value.isoformat(timespec="milliseconds")
        return value.isoformat()  # every digit it has: pandas' Timestamp (nanosecond units) gives nine
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return _seconds(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [to_jsonable(v) for v in value]
    return str(value)


def _seconds(value: dt.timedelta) -> float | str:
    """A duration in seconds, exactly: a float when one holds it, else its decimal text (pandas' Timedelta
    counts nanoseconds, more digits than a float keeps)."""
    nanos = getattr(value, "value", None)  # pandas' Timedelta
    exact = (
        decimal.Decimal(nanos).scaleb(-9)
        if isinstance(nanos, int)
        else decimal.Decimal(value // dt.timedelta(microseconds=1)).scaleb(-6)
    )
    seconds = float(exact)
    return seconds if decimal.Decimal(repr(seconds)) == exact else str(exact.normalize())


def print_json(value: Any, *, stream: IO[str] | None = None) -> None:
    """One indented JSON document."""
    out = stream or sys.stdout
    out.write(json.dumps(to_jsonable(value), indent=2, sort_keys=False, allow_nan=False) + "\n")


def json_line(value: Any) -> str:
    """One compact JSON line (for streams of records)."""
    return json.dumps(to_jsonable(value), separators=(",", ":"), allow_nan=False)


def format_duration(ms: int | float | None) -> str:
    """A person's duration: ``850 ms``, ``12.3 s``, ``5 m 02 s``, ``3 h 04 m``, ``2 d 03 h``; ``-`` for None."""
    if ms is None:
        return "-"
    ms = max(0, int(ms))
    if ms < 1000:
        return f"{ms} ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m} m {sec:02d} s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m:02d} m"
    d, h = divmod(h, 24)
    return f"{d} d {h:02d} h"


def format_bytes(n: int | None) -> str:
    """``812 B``, ``3.2 KiB``, ``1.5 GiB``; ``-`` for None."""
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def format_offsets(first: int | None, following: int | None) -> str:
    """An offset range ``[first, following)``; ``?`` for an end nobody knows."""
    return f"[{'?' if first is None else first}, {'?' if following is None else following})"


def format_time(ms: int | None) -> str:
    """An epoch-milliseconds time as ISO-8601 UTC (``2026-05-01T12:00:00.123Z``); ``-`` for None/0."""
    if not ms:
        return "-"
    t = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def format_cell(value: Any, max_width: int | None = MAX_CELL) -> str:
    """A table cell: ``-`` for None, ISO times, cut to ``max_width`` characters (None: never cut)."""
    if value is None:
        text = "-"
    elif isinstance(value, dt.datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d}"
    elif isinstance(value, bytes | bytearray):
        text = bytes(value).hex()
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, dict | list):
        text = json.dumps(to_jsonable(value), separators=(",", ":"), allow_nan=False)
    else:
        text = str(value)
    text = text.replace("\n", "\\n")
    return text if max_width is None or len(text) <= max_width else text[: max_width - 1] + "…"


# --- tables ------------------------------------------------------------------------------------


def render_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, full: Sequence[str] = ()) -> str:
    """A fixed-width table: a header line, then one line per row. Numbers are right-aligned; cells are cut
    to :data:`MAX_CELL` characters except in the columns named in ``full``."""
    raw = [list(r) for r in rows]
    numeric = [
        all((isinstance(r[i], int | float) and not isinstance(r[i], bool)) or r[i] is None for r in raw)
        and any(r[i] is not None for r in raw)
        for i in range(len(headers))
    ]
    limits = [None if h in full else MAX_CELL for h in headers]
    cells = [[format_cell(v, limits[i]) for i, v in enumerate(r)] for r in raw]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if numeric[i] else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True))]
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(headers)), *(line(r) for r in cells)])


def print_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], *, empty: str | None = None, full: Sequence[str] = ()
) -> None:
    """Print a table, or ``empty`` (if given) when there are no rows."""
    rows = list(rows)
    if not rows and empty is not None:
        print(empty)
        return
    print(render_table(headers, rows, full=full))


def print_fields(pairs: Sequence[tuple[str, Any]]) -> None:
    """``key: value`` lines with the keys aligned."""
    width = max((len(k) for k, _ in pairs), default=0)
    for k, v in pairs:
        print(f"{k + ':':<{width + 1}} {'-' if v is None else v}")


# --- progress ----------------------------------------------------------------------------------


class Progress:
    """A progress bar on stderr for operations that may take more than a couple of seconds.

    Drawn by a background thread (so hot loops only bump a counter), only when ``stream`` is a terminal,
    and only after ``delay_s``. With ``total=None`` it shows a spinner with the elapsed time. Use as a
    context manager; the line is erased on exit.
    """

    _SPIN = "|/-\\"

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        unit: str = "",
        stream: IO[str] | None = None,
        delay_s: float = 0.5,
        interval_s: float = 0.1,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.delay_s = delay_s
        self.interval_s = interval_s
        self.done = 0
        self.enabled = _is_tty(self.stream)
        self._started = time.monotonic()
        self._drawn = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ticks = 0

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="txnlog-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def advance(self, n: int = 1) -> None:
        self.done += n

    def update(self, done: int, *, label: str | None = None) -> None:
        self.done = done
        if label is not None:
            self.label = label

    def render(self, width: int = 30) -> str:
        """The current line (without the carriage return)."""
        elapsed = time.monotonic() - self._started
        if self.total:
            frac = min(1.0, self.done / self.total)
            filled = int(frac * width)
            bar = "#" * filled + "." * (width - filled)
            unit = f" {self.unit}" if self.unit else ""
            return f"{self.label} [{bar}] {self.done}/{self.total}{unit} {elapsed:.1f} s"
        spin = self._SPIN[self._ticks % len(self._SPIN)]
        count = f" {self.done} {self.unit}" if self.done and self.unit else ""
        return f"{self.label} {spin}{count} {elapsed:.1f} s"

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if time.monotonic() - self._started < self.delay_s:
                continue
            self._ticks += 1
            self.stream.write("\r\033[K" + self.render())
            self.stream.flush()
            self._drawn = True


def _is_tty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
