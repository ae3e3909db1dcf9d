"""The one exception type opperf raises for bad input, so scripts can print it on one line and exit 2."""

from __future__ import annotations

from pathlib import Path


class OpperfError(Exception):
    """A user-facing error: says which file, row and field are wrong, and what to do.

    `row` is the 1-based line number in the file as a text editor shows it (the header is line 1),
    or None when the problem is not tied to one row.
    """

    def __init__(self, message: str, *, path: str | Path | None = None, row: int | None = None,
                 field: str | None = None):
        self.path = str(path) if path is not None else None
        self.row = row
        self.field = field
        self.reason = message
        where = []
        if self.path is not None:
            where.append(self.path)
        if row is not None:
            where.append(f"line {row}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = ": ".join([", ".join(where)]) + ": " if where else ""
        super().__init__(prefix + message)


class DeviceUnavailableError(OpperfError):
    """The back end asked for (npu, cuda) is not present on this host."""
