"""Real OS faults for a child process: a full disk, a read-only file system, a directory it may not write.

With user namespaces (`unshare` from util-linux; no root needed, and the faults hold for root too):
- disk_full: a 64 KiB tmpfs, filled up, mounted over the output directory: writes fail with ENOSPC;
- read_only: the output directory bind-mounted read-only: EROFS;
- no_permission: the child runs as an unprivileged user (uid 1000, no capabilities) and the output directory
  is mode 0555: EACCES.
Without user namespaces: a file size limit of 0 (RLIMIT_FSIZE; a write fails with EFBIG, SIGXFSZ ignored)
stands in for the full disk, and chmod 0555 for the other two when not root (as root they cannot be made).

A tmpfs vanishes with its namespace, so what the command left in the directory is listed inside it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

FAULTS = ("disk_full", "read_only", "no_permission")
# What each fault makes the OS say (the one-line error quotes it).
REASONS = {"disk_full": "No space left on device (ENOSPC)", "read_only": "Read-only file system (EROFS)",
           "no_permission": "Permission denied (EACCES)", "file_too_large": "File too large (EFBIG)"}
TMPFS_KIB = 64


@functools.cache
def namespaces_work() -> bool:
    """Whether `unshare` can give this process a user and mount namespace (and mount a tmpfs in it)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


def available(fault: str) -> str | None:
    """The reason `fault` cannot be produced here, or None."""
    if namespaces_work() or fault == "disk_full" or os.geteuid() != 0:
        return None
    return f"{fault}: needs user namespaces (unshare) when the tests run as root"


def expected_reason(fault: str) -> str:
    """The OS's words for `fault` as produced here (a full disk is EFBIG without namespaces)."""
    if fault == "disk_full" and not namespaces_work():
        return REASONS["file_too_large"]
    return REASONS[fault]


@dataclass
class FaultRun:
    returncode: int
    stdout: str
    stderr: str
    left: list[str]          # what the command left in the faulty directory (relative paths)

    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]


_SCRIPT = """
set -u
dir=$1; listing=$2; how=$3; shift 3
case $how in
  tmpfs) mount -t tmpfs -o size={kib}k tmpfs "$dir" || exit 99
         head -c {kib}k /dev/zero > "$dir/.filler" 2>/dev/null ;;
  robind) mount --bind "$dir" "$dir" && mount -o remount,bind,ro "$dir" || exit 99 ;;
esac
if [ "$how" = fsize ]; then (trap '' XFSZ; ulimit -f 0; exec "$@"); else "$@"; fi
rc=$?
rm -f "$dir/.filler" 2>/dev/null
(cd "$dir" && find . -mindepth 1 | sed 's#^./##' | sort) > "$listing"
exit $rc
""".format(kib=TMPFS_KIB)


def run_with_fault(fault: str, command: list[str], directory: Path, *, cwd: Path | None = None,
                   env: dict | None = None, timeout: float = 300) -> FaultRun:
    """Run `command` with `fault` on `directory` (which must exist, and is where the command writes)."""
    directory = Path(directory)
    listing = directory.parent / f".{directory.name}.listing"
    listing.unlink(missing_ok=True)
    wrapper = ["sh", "-c", _SCRIPT, "sh"]
    if namespaces_work():
        how = {"disk_full": "tmpfs", "read_only": "robind", "no_permission": "none"}[fault]
        if fault == "no_permission":
            directory.chmod(0o555)
            wrapper = ["unshare", "--map-user=1000", "--map-group=1000", *wrapper]
        else:
            wrapper = ["unshare", "-rm", *wrapper]
    elif fault == "disk_full":
        how = "fsize"
    else:
        how = "none"
        directory.chmod(0o555)
    try:
        done = subprocess.run([*wrapper, str(directory), str(listing), how, *command], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=timeout)
    finally:
        directory.chmod(0o755)
    if done.returncode == 99:
        raise RuntimeError(f"could not set up {fault}: {done.stderr}")
    left = listing.read_text().split("\n") if listing.exists() else []
    listing.unlink(missing_ok=True)
    return FaultRun(done.returncode, done.stdout, done.stderr, [name for name in left if name])
