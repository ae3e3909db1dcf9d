"""Atomic file writes and strict CSV reading shared by every stage.

A database file is either the old one or the complete new one, never a half-written mix: we write a
temporary file in the same directory and `os.replace` it over the target.
"""

from __future__ import annotations

import contextlib
import csv
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from opperf.errors import OpperfError

if TYPE_CHECKING:      # pandas is imported where it is used: text-only writers (traces) start faster without it
    import pandas as pd


@contextlib.contextmanager
def atomic_output(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator:
    """Open a temporary sibling of `path` for writing; on success it replaces `path`, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        kwargs = {} if "b" in mode else {"encoding": encoding, "newline": ""}
        with os.fdopen(fd, mode, **kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_output(path) as handle:
        handle.write(text)


def write_csv_atomic(path: str | Path, frame: "pd.DataFrame") -> None:
    """Write a DataFrame as CSV (all values as text, no index), atomically."""
    with atomic_output(path) as handle:
        frame.to_csv(handle, index=False, lineterminator="\n")


def read_database_csv(path: str | Path, required: tuple[str, ...] = ()) -> "pd.DataFrame":
    """Read a database CSV as strings (no dtype guessing: shapes like `4096,512` must stay text).

    Missing files, empty files and missing required columns are errors naming the file and field.
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise OpperfError("file not found", path=path)
    if path.stat().st_size == 0:
        raise OpperfError("file is empty (no header)", path=path)
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False, encoding="utf-8-sig")
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise OpperfError(f"cannot parse CSV: {exc}", path=path) from exc
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise OpperfError(f"missing required column(s) {missing}", path=path, field=missing[0])
    return frame


def csv_header(path: str | Path) -> list[str]:
    with open(path, newline="", encoding="utf-8-sig") as handle:
        return next(csv.reader(handle), [])
