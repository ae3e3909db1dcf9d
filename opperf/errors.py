"""The one exception type opperf raises for bad input, so scripts can print it on one line and exit 2."""

from __future__ import annotations

import errno
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


def os_reason(exc: OSError) -> str:
    """The OS's own words for a failed call, with its errno name: `No space left on device (ENOSPC)`."""
    reason = exc.strerror or str(exc)
    name = errno.errorcode.get(exc.errno) if exc.errno is not None else None
    return f"{reason} ({name})" if name else reason


class OutputError(OpperfError):
    """Writing an output failed in the OS (disk full, read-only file system, no permission): the path it
    was writing and the OS's reason, never the temporary file's name or a traceback."""

    def __init__(self, target: str | Path, cause: OSError):
        self.target = Path(target)
        self.cause = cause
        super().__init__(f"cannot write: {os_reason(cause)}", path=target)

    def moved_to(self, staging: Path, target: Path) -> OutputError:
        """The same error, naming the file under `target` that the staged file under `staging` was for."""
        try:
            relative = self.target.relative_to(staging)
        except ValueError:
            return self
        return OutputError(target / relative if relative.parts else target, self.cause)


def os_error_line(exc: OSError) -> str:
    """An OSError that reached a script's top: the path(s) it names and the OS's reason, on one line."""
    paths = [str(p) for p in (exc.filename, getattr(exc, "filename2", None)) if p is not None]
    return f"{' -> '.join(paths)}: {os_reason(exc)}" if paths else os_reason(exc)
