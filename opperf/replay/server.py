"""A replay process that outlives one job: torch imported and the profiler initialised once per device.

On a GPU host a fresh replay process spends ~5 s importing torch and ~5 s in the first profiler
session (CUPTI start-up) before it replays anything (benchmarks/results/cuda_replay/; startup_probe.py at
3a08364), so a kernel type with a handful of rows cost 10 s. A job therefore hands its rows to a server process bound to its
device slot; the server stays for `idle_timeout_s` after its last request and serves the next job of
that slot at once. Everything else stays as with a child per job: the server appends the same
progress records, a row that crashes or hangs the server is recorded (`failed_crash` /
`failed_timeout`), the server is killed and a fresh one carries on with the remaining rows.

One server per (python, torch, opperf code, checkout, back end, device id, slots directory, environment): a
server never runs code older than the checkout (the key hashes the content of every opperf source file and
names the checkout directory's inode, so a tree replaced at the same path, even with identical mtimes, gets a
new server), and never serves two jobs at once (the device slot lock is held by the job for the whole
request). Each request runs in the job's own working directory (the job sends it; its paths are absolute
anyway), so a server started from another directory, or one whose directory was deleted, serves it right.
Whatever a job starts ends with it: the worker closes its timer (the cuda timer's NVML sampler thread) when the
job ends; a thread left per job would poll beside every later job of the server.
Not used under a wrapping profiler (npu: msprof must start the replay process itself).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_IDLE_TIMEOUT_S = float(os.environ.get("OPPERF_REPLAY_SERVER_IDLE_S", "300"))
START_TIMEOUT_S = 180.0


# Variables that change what a replay process loads or sees: a server started under other values is not reused.
KEY_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "PYTHONPATH", "LD_LIBRARY_PATH",
                 "LD_PRELOAD", "ASCEND_CUSTOM_OPP_PATH", "OMP_NUM_THREADS")


def code_fingerprint() -> str:
    """The content of every opperf source file and the checkout directory's identity: any change of the code,
    or a tree replaced at the same path, gets a new server."""
    digest = hashlib.sha256()
    root = PACKAGE_ROOT.stat()
    # A file system may give a tree recreated at the same path its old inode back; the package file's
    # change time (set when the file is created, untouched by running the code) tells the trees apart.
    package = (PACKAGE_ROOT / "opperf" / "__init__.py").stat()
    digest.update(f"{PACKAGE_ROOT}:{root.st_dev}:{root.st_ino}:{package.st_ino}:{package.st_ctime_ns}\n".encode())
    for path in sorted((PACKAGE_ROOT / "opperf").rglob("*.py")):
        digest.update(f"{path.relative_to(PACKAGE_ROOT)}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _installed(package: str) -> str:
    """A package's version and location, without importing it (a reinstalled torch gets a new server)."""
    from importlib import metadata

    try:
        distribution = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        return ""
    return f"{distribution.version}@{distribution.locate_file('')}"


def socket_path(backend: str, device_id: int | None, slots_dir: str | Path, env: dict[str, str]) -> Path:
    """Where the server of this slot listens (a short path: Unix sockets allow ~100 characters)."""
    key = json.dumps([sys.executable, _installed("torch"), code_fingerprint(), backend, device_id,
                      str(Path(slots_dir).resolve()), [env.get(v, "") for v in KEY_VARIABLES]])
    directory = Path(tempfile.gettempdir()) / f"opperf-replay-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    return directory / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.sock"


class ServerCall:
    """One request to a server, with the Popen-like surface the isolation loop polls and kills."""

    def __init__(self, connection: socket.socket, pid: int, log_path: Path):
        self.connection, self.pid, self.log_path = connection, pid, log_path
        self.returncode: int | None = None
        self._buffer = b""

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        try:
            data = self.connection.recv(65536)
        except BlockingIOError:
            return None
        if data:
            self._buffer += data
            if b"\n" in self._buffer:
                self.returncode = int(json.loads(self._buffer.split(b"\n", 1)[0])["status"])
                self.connection.close()
            return self.returncode
        # EOF without a reply: the server died in the request (crash, OOM kill).
        self.connection.close()
        self.returncode = _exit_status(self.pid)
        return self.returncode

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _exit_status(self.pid)
        self.connection.close()


def _exit_status(pid: int) -> int:
    """The server's exit status if this process started it (else -SIGKILL: it is gone, why is in its log)."""
    for _ in range(100):
        try:
            waited, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return -signal.SIGKILL
        if waited:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    return -signal.SIGKILL


def _connect(path: Path) -> tuple[socket.socket, int] | None:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(path))
        handshake = b""
        while not handshake.endswith(b"\n"):
            chunk = client.recv(4096)
            if not chunk:
                raise ConnectionError("closed during handshake")
            handshake += chunk
    except OSError:
        client.close()
        return None
    return client, int(json.loads(handshake)["pid"])


def call(worker_argv: list[str], *, backend: str, device_id: int | None, slots_dir: str | Path,
         env: dict[str, str], idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S, cwd: str | Path | None = None
         ) -> ServerCall:
    """Send one replay request (the worker's command line) to the slot's server, starting it if needed; the
    request runs in `cwd` (default: this process's working directory)."""
    cwd = str(Path(cwd or os.getcwd()).resolve())
    path = socket_path(backend, device_id, slots_dir, env)
    log_path = path.with_suffix(".log")
    connected = _connect(path)
    if connected is None:
        path.unlink(missing_ok=True)
        with open(log_path, "ab") as log:
            process = subprocess.Popen([sys.executable, "-m", "opperf.replay.server", "--socket", str(path),
                                        "--idle-timeout-s", str(idle_timeout_s)],
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                       cwd=cwd, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while connected is None:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                tail = log_path.read_text(encoding="utf-8", errors="replace")[-1500:]
                raise RuntimeError(f"the replay server did not start (exit {process.returncode}): {tail}")
            time.sleep(0.05)
            connected = _connect(path)
    connection, pid = connected
    connection.sendall(json.dumps({"argv": worker_argv, "cwd": cwd}).encode() + b"\n")
    connection.setblocking(False)
    return ServerCall(connection, pid, log_path)


def serve(path: Path, idle_timeout_s: float) -> int:
    """Accept requests one at a time until idle for idle_timeout_s; each runs the worker in this process."""
    import torch  # noqa: F401  (the point: imported once, before the first request)

    from opperf.replay import worker

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(1)
    listener.settimeout(idle_timeout_s)
    try:
        while True:
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                return 0
            with connection:
                connection.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
                request = b""
                while not request.endswith(b"\n"):
                    chunk = connection.recv(65536)
                    if not chunk:
                        break
                    request += chunk
                if not request.endswith(b"\n"):
                    continue                 # a client that only probed whether we are alive
                try:
                    message = json.loads(request)
                    os.chdir(message["cwd"])        # the job's directory, whatever this server started in
                    status = worker.main(message["argv"])
                except Exception:  # noqa: BLE001 — the job reads it in the log, as a child's stderr
                    import traceback

                    traceback.print_exc()
                    sys.stderr.flush()
                    status = 1
                worker.release_device_memory()
                connection.sendall(json.dumps({"status": status}).encode() + b"\n")
    finally:
        listener.close()
        path.unlink(missing_ok=True)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="opperf replay server (started by replay jobs; see module doc)")
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--idle-timeout-s", type=float, default=DEFAULT_IDLE_TIMEOUT_S)
    args = parser.parse_args(argv)
    return serve(args.socket, args.idle_timeout_s)


if __name__ == "__main__":
    sys.exit(main())
