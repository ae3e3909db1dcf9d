"""Atomic file writes and strict CSV reading shared by every stage.

A database file is either the old one or the complete new one, never a half-written mix: we write a
temporary file in the same directory and `os.replace` it over the target.

`mkstemp`/`mkdtemp` create their files 0600 / directories 0700 whatever the umask, and a rename keeps that
mode: on a shared filesystem a team's database would be readable by its builder only. Every temporary
file or directory that becomes an output therefore gets the mode an ordinary `open()`/`mkdir()` would have
given it (`created_mode`), so the user's umask decides, as it does for every other program.

Faults: an OS error while writing (disk full, read-only file system, no permission) becomes one
`OutputError` naming the output and the OS's reason; the temporary is removed. A temporary's name says
which process wrote it (`.{name}.{pid}@{host}.XXXXXXXX.tmp`), so the next write into the same directory
removes what a killed run left behind without touching a live writer's (`clear_stale_temporaries`). Inside
`all_or_nothing()` (every script runs in one) a run that fails also removes the outputs it created.
"""

from __future__ import annotations

import contextlib
import contextvars
import csv
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from opperf.errors import OpperfError, OutputError

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


# --- temporaries and what a failed run created ----------------------------------------------------

TEMP_SUFFIX = ".tmp"
# A writer on another host cannot be asked whether it still runs; its temporary counts as abandoned after this.
FOREIGN_TEMP_STALE_AFTER_S = 24 * 3600
# A temporary's name: `.{target name}.{pid}@{host}.{random}[.old].tmp` (the writer tagged, so it can be asked).
_TAGGED_TEMP = re.compile(r"^\..+\.(?P<pid>\d+)@(?P<host>[A-Za-z0-9_-]+)\.[^.]+(\.old)?\.tmp$")
# Temporaries named before they carried their writer (`.{name}.XXXXXXXX.tmp`, `.{name}.old.XXXXXXXX`).
_UNTAGGED_TEMP = re.compile(r"^([a-z0-9_]{8}\.tmp|old\.[a-z0-9_]{8})$")


def _host() -> str:
    """Where this process's pid means something: the host name and, on Linux, the pid namespace (containers
    on one host may share its name but not its pids)."""
    try:
        namespace = f"-{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        namespace = ""
    return re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname()) + namespace


def _writer_tag() -> str:
    """`pid@host` of this process (a tag holds no dot)."""
    return f"{os.getpid()}@{_host()}"


def temp_prefix(target: str | Path) -> str:
    """The name prefix of this process's temporaries for `target`: `.{name}.{pid}@{host}.`."""
    return f".{Path(target).name}.{_writer_tag()}."


def _writer_is_gone(pid: int, host: str, path: Path) -> bool:
    if host != _host():
        try:
            return time.time() - path.lstat().st_mtime > FOREIGN_TEMP_STALE_AFTER_S
        except OSError:
            return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:          # alive, someone else's
        return False
    return False


def clear_stale_temporaries(target: str | Path) -> list[Path]:
    """Remove the temporaries a killed run left in `target`'s directory: every tagged one whose writer is
    gone (whatever output it was for: trace names change from run to run), and untagged ones of `target`."""
    target = Path(target)
    own_prefix = f".{target.name}."
    removed = []
    try:
        candidates = [p for p in target.parent.iterdir() if p.name.startswith(".") and
                      (p.name.endswith(TEMP_SUFFIX) or p.name.startswith(own_prefix))]
    except OSError:
        return removed
    for path in candidates:
        tagged = _TAGGED_TEMP.match(path.name)
        if tagged:
            stale = _writer_is_gone(int(tagged["pid"]), tagged["host"], path)
        else:
            stale = path.name.startswith(own_prefix) and bool(_UNTAGGED_TEMP.match(path.name[len(own_prefix):]))
        if not stale:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        removed.append(path)
    return removed


# What the current all_or_nothing() block created: (path, whole) where `whole` is a directory that is an output
# in its own right (removed with its content) rather than a parent made for one (removed only if left empty).
_created: contextvars.ContextVar[list[tuple[Path, bool]] | None] = contextvars.ContextVar("opperf_created",
                                                                                          default=None)


def _note_created(path: Path, whole: bool = True) -> None:
    created = _created.get()
    if created is not None:
        created.append((path, whole))


def _remove_created(created: list[tuple[Path, bool]]) -> None:
    for path, whole in reversed(created):
        try:
            if path.is_dir() and not path.is_symlink():
                if whole:
                    shutil.rmtree(path)
                else:
                    path.rmdir()                 # a parent another job may have written into meanwhile: kept then
            else:
                path.unlink()
        except OSError:
            continue


@contextlib.contextmanager
def all_or_nothing() -> Iterator[None]:
    """Outputs (files, directories) created inside are removed again if the block raises.

    Files that already existed and were replaced keep their complete new content: removing them would
    lose a database file that an in-place update had finished.
    """
    outer = _created.get()
    created: list[tuple[Path, bool]] = []
    token = _created.set(created)
    try:
        yield
    except BaseException:
        _remove_created(created)
        raise
    finally:
        _created.reset(token)
    if outer is not None:
        outer.extend(created)


def make_parents(path: Path) -> None:
    """`path.parent.mkdir(parents=True)`, noting the directories it creates (removed if the run fails empty)."""
    missing = []
    parent = path.parent
    while not parent.exists() and parent != parent.parent:      # an existing file stops it: ENOTDIR below
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            if not directory.is_dir():
                raise
            continue
        _note_created(directory, whole=False)


@contextlib.contextmanager
def atomic_output(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator:
    """Open a temporary sibling of `path` for writing; on success it replaces `path`, on error it is removed.

    An OS error on the way (the directory cannot be made, the disk fills, the file system is read-only)
    is raised as an OutputError naming `path`.
    """
    path = Path(path)
    clear_stale_temporaries(path)
    try:
        make_parents(path)
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=TEMP_SUFFIX, dir=path.parent)
    except OSError as exc:
        raise OutputError(path, exc) from exc
    try:
        os.fchmod(fd, created_mode())
        kwargs = {} if "b" in mode else {"encoding": encoding, "newline": ""}
        with os.fdopen(fd, mode, **kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        created = not path.exists()
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if exc.filename not in (None, tmp, str(path)):
            raise                                    # another file's error (an input read inside the block)
        raise OutputError(path, exc) from exc
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if created:
        _note_created(path)


def check_writable(*targets: str | Path) -> None:
    """Create and remove a temporary beside each target now, so a long stage (replay) on a read-only or
    forbidden output directory stops at once with the OutputError it would meet at its end. (A full disk may
    still let an empty file be made: that is met, and cleaned up, when the real write fails.)"""
    for target in map(Path, targets):
        try:
            make_parents(target)
            fd, tmp = tempfile.mkstemp(prefix=temp_prefix(target), suffix=TEMP_SUFFIX, dir=target.parent)
            os.close(fd)
            os.unlink(tmp)
        except OSError as exc:
            raise OutputError(target, exc) from exc


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

    Missing files, empty files, bytes that are not UTF-8 and missing required columns are errors naming
    the file, line and field.
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise OpperfError("file not found", path=path)
    if path.stat().st_size == 0:
        raise OpperfError("file is empty (no header)", path=path)
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False, encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise (not_utf8_error(path) or OpperfError(f"not UTF-8 text: {exc.reason}", path=path)) from exc
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise OpperfError(f"cannot parse CSV: {exc}", path=path) from exc
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise OpperfError(f"missing required column(s) {missing}", path=path, field=missing[0])
    return frame


def not_utf8_error(path: str | Path, delimiter: str = ",") -> OpperfError | None:
    """Where a CSV first holds bytes that are not UTF-8, as an error naming its line and column (None: none).

    The decoder reports a byte offset into a buffer; a user needs the line a text editor shows, the column
    number and (below the header) the column's name.
    """
    path = Path(path)
    header: list[str] = []
    with open(path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            if line_number == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                fields = next(csv.reader([raw.decode("utf-8", errors="replace")], delimiter=delimiter), [])
                index = next((i for i, value in enumerate(fields) if "\ufffd" in value),
                             raw[:exc.start].count(delimiter.encode()))
                name = header[index] if line_number > 1 and index < len(header) else None
                return OpperfError(f"not UTF-8 text: byte 0x{raw[exc.start]:02x} in column {index + 1}", path=path,
                                   row=line_number, field=name)
            if line_number == 1:
                header = next(csv.reader([text], delimiter=delimiter), [])
    return None


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
    types the old manifest listed and the new one lacks removed. On error nothing new is published;
    an OS error is an OutputError naming the file under `target` it was for.
    """
    target = Path(target)
    clear_stale_temporaries(target)
    try:
        make_parents(target)
        staging = make_temp_dir(prefix=temp_prefix(target), suffix=TEMP_SUFFIX, dir=target.parent)
    except OSError as exc:
        raise OutputError(target, exc) from exc
    outer = _created.set(None)           # files made inside the staging directory are not outputs themselves
    try:
        try:
            yield staging
        finally:
            _created.reset(outer)
        _publish(staging, target, replace_whole)
    except OutputError as exc:
        raise exc.moved_to(staging, target) from exc.cause
    except OSError as exc:
        if exc.filename is not None and not _is_under(exc.filename, staging, target):
            raise                                    # another file's error (an input read inside the block)
        failed = Path(exc.filename) if exc.filename is not None else target
        raise OutputError(failed, exc).moved_to(staging, target) from exc
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _is_under(name: str | bytes, *directories: Path) -> bool:
    path = Path(os.fsdecode(name))
    return any(path == d or d in path.parents for d in directories)


def _publish(staging: Path, target: Path, replace_whole: bool) -> None:
    """Move a filled staging directory's files into `target` (see staged_directory)."""
    from opperf.contract import KERNEL_TYPES_MANIFEST, kernel_type_problem

    for path in staging.iterdir():
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    if not target.exists():
        os.rename(staging, target)
        _note_created(target)
        return
    if replace_whole:
        aside = make_temp_dir(prefix=temp_prefix(target), suffix=f".old{TEMP_SUFFIX}", dir=target.parent)
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
        created = not (target / path.name).exists()
        os.replace(path, target / path.name)
        if created:
            _note_created(target / path.name)
    for kernel_type in old_types - new_types:
        if kernel_type_problem(kernel_type) is None:
            with contextlib.suppress(FileNotFoundError):
                (target / f"{kernel_type}.csv").unlink()
