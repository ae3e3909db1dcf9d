"""Atomic file writes and strict CSV reading shared by every stage.

A database file is either the old one or the complete new one, never a half-written mix: we write a
temporary file in the same directory and `os.replace` it over the target.

`mkstemp`/`mkdtemp` create their files 0600 / directories 0700 whatever the umask, and a rename keeps that
mode: on a shared filesystem a team's database would be readable by its builder only. Every temporary
file or directory that becomes an output therefore gets the mode an ordinary `open()`/`mkdir()` would have
given it (`created_mode`), so the user's umask decides, as it does for every other program.
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from opperf.errors import OpperfError

if TYPE_CHECKING:      # pandas is imported where it is used: text-only writers (traces) start faster without it
    import pandas as pd


def current_umask() -> int:
    """The process umask, read without changing it (os.umask only sets, and setting races with threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)      # no /proc (macOS): the classic read-by-setting, restored at once
    os.umask(mask)
    return mask


def created_mode(*, directory: bool = False, executable: bool = False) -> int:
    """The mode open()/mkdir() would give a new file (0666) or directory/executable (0777) under the umask."""
    return (0o777 if directory or executable else 0o666) & ~current_umask()


def make_temp_dir(prefix: str, dir: str | Path, suffix: str = "") -> Path:
    """`tempfile.mkdtemp` whose directory gets the umask's mode, since it is renamed into place as an output."""
    path = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=dir))
    os.chmod(path, created_mode(directory=True))
    return path


@contextlib.contextmanager
def atomic_output(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator:
    """Open a temporary sibling of `path` for writing; on success it replaces `path`, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, created_mode())
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


def write_text_atomic(path: str | Path, text: str, *, executable: bool = False) -> None:
    """Write text atomically; `executable` files (standalone reproducers) get the umask's 0777 mode."""
    with atomic_output(path) as handle:
        handle.write(text)
        if executable:
            os.fchmod(handle.fileno(), created_mode(executable=True))


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


@contextlib.contextmanager
def staged_directory(target: str | Path, *, replace_whole: bool = False) -> Iterator[Path]:
    """A temporary sibling of `target` to fill; on success its files are published into `target`.

    A new `target` appears by one rename, complete. An existing one is either swapped whole
    (`replace_whole`: renamed aside, the new one renamed in, the old one put back if that fails) or
    kept existing throughout: each file replaced atomically (the kernel-types manifest last, so a
    reader that trusts it never sees a type whose CSV is not there yet), then the CSVs of kernel
    types the old manifest listed and the new one lacks removed. On error nothing new is published.
    """
    from opperf.contract import KERNEL_TYPES_MANIFEST, kernel_type_problem

    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = make_temp_dir(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        yield staging
        for path in staging.iterdir():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        if not target.exists():
            os.rename(staging, target)
            return
        if replace_whole:
            aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            os.replace(target, aside / target.name)
            try:
                os.rename(staging, target)
            except BaseException:
                os.replace(aside / target.name, target)
                raise
            finally:
                shutil.rmtree(aside, ignore_errors=True)
            return
        old_manifest = target / KERNEL_TYPES_MANIFEST
        old_types = set(old_manifest.read_text(encoding="utf-8").split()) if old_manifest.is_file() else set()
        new_manifest = staging / KERNEL_TYPES_MANIFEST
        new_types = set(new_manifest.read_text(encoding="utf-8").split()) if new_manifest.is_file() else set()
        for path in sorted(staging.iterdir(), key=lambda p: p.name == KERNEL_TYPES_MANIFEST):
            os.replace(path, target / path.name)
        for kernel_type in old_types - new_types:
            if kernel_type_problem(kernel_type) is None:
                with contextlib.suppress(FileNotFoundError):
                    (target / f"{kernel_type}.csv").unlink()
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def read_yaml_mapping(path: Path, what: str) -> dict:
    """A YAML file whose top level is a mapping; unreadable, invalid or other YAML is an error naming the file."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise OpperfError(f"cannot read the {what}: {exc}", path=path) from exc
    except yaml.YAMLError as exc:
        raise OpperfError(f"not valid YAML: {exc}", path=path) from exc
    if not isinstance(raw, dict):
        raise OpperfError(f"the {what} must be a mapping at the top level", path=path)
    return raw
