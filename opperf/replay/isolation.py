"""Run a kernel type's replay in child processes, so a crash, hang or OOM costs rows, not the run.

The child (`python -m opperf.replay.worker`) announces each row before it starts and reports its
outcome after it ends. When the child dies (abort, segfault, OOM kill) the row it was running is
recorded as `failed_crash` with the exit status and the end of its stderr; when a row runs past
`timeout_s` the child's process group is killed and the row is recorded as `failed_timeout`. A fresh
child then carries on with the next row, up to `max_restarts` times; rows never reached after that
are recorded as `not_run` with the reason. Nothing is silently dropped. A definition that does not resolve here (its api,
hook or modules missing) is the job's error: the child reports it before any row and this raises it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from opperf.errors import OpperfError
from opperf.log import Progress, get_logger
from opperf.replay.methods import DEFAULT_HEATER_MIN_POWER_W, DEFAULT_MIN_REPEAT_COUNT
from opperf.replay.engine import (FAILED_STATUSES, STATUS_FAILED_CRASH, STATUS_FAILED_TIMEOUT, STATUS_NOT_RUN, RowOutcome)

log = get_logger("replay.isolation")
POLL_INTERVAL_S = 0.02
STDERR_TAIL_CHARS = 1500


@dataclass(frozen=True)
class WorkerSettings:
    """Everything the child needs besides the row indices."""

    rows_path: str
    kernel_type: str
    definition_path: str
    backend: str
    repeat_count: int
    warmup_count: int
    memory_budget_bytes: int | None = None
    heater_min_power_w: float = DEFAULT_HEATER_MIN_POWER_W
    unprofiled_power_w: float | None = None
    seed: int = 0
    cpu_threads: int | None = None
    time_budget_s: float | None = None          # None: every row gets repeat_count timed calls
    min_repeat_count: int = DEFAULT_MIN_REPEAT_COUNT

    def command(self, indices_path: Path, progress_path: Path, python: str = sys.executable) -> list[str]:
        command = [python, "-m", "opperf.replay.worker", "--rows", self.rows_path, "--kernel", self.kernel_type,
                   "--definition", self.definition_path, "--backend", self.backend,
                   "--indices", str(indices_path), "--progress", str(progress_path),
                   "--repeat-count", str(self.repeat_count), "--warmup-count", str(self.warmup_count),
                   "--heater-min-power", repr(self.heater_min_power_w), "--seed", str(self.seed)]
        if self.unprofiled_power_w is not None:
            command += ["--unprofiled-power", repr(self.unprofiled_power_w)]
        if self.memory_budget_bytes is not None:
            command += ["--memory-budget-bytes", str(self.memory_budget_bytes)]
        if self.cpu_threads is not None:
            command += ["--cpu-threads", str(self.cpu_threads)]
        if self.time_budget_s is not None:
            command += ["--time-budget-s", repr(self.time_budget_s), "--min-repeat-count", str(self.min_repeat_count)]
        return command


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (killed: out of memory?)" if -returncode == signal.SIGKILL else ""
        return f"the replay process died with {name}{hint}"
    return f"the replay process exited with status {returncode}"


def _tail(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return " ".join(text[-STDERR_TAIL_CHARS:].split())


def _kill_group(process) -> None:
    if not isinstance(process, subprocess.Popen):       # a persistent server's call
        process.kill()
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def run_isolated(settings: WorkerSettings, indices: Sequence[int], *, timeout_s: float, max_restarts: int = 3,
                 env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
                 wrap_command: Callable[[list[str], int], list[str]] | None = None,
                 stop_on_failure: bool = False, server: Mapping | None = None) -> dict[int, RowOutcome]:
    """Replay rows `indices` in child processes; every index gets an outcome.

    `wrap_command(command, attempt)` lets a back end wrap the child (NPU: `msprof --output=...`).
    `stop_on_failure` (--fail-fast): after the first failed row, stop; the rest are `not_run`.
    `server` ({backend, device_id, slots_dir}): send the rows to the slot's persistent replay process
    (`opperf.replay.server`) instead of starting a child; crashes and timeouts are handled the same way.
    """
    outcomes: dict[int, RowOutcome] = {}
    remaining = list(indices)
    restarts = 0
    row_progress = Progress(log, f"replay {settings.kernel_type}", len(indices))
    measured: set[int] = set()          # rows whose calls ran; their samples come with their batch
    child_env = dict(os.environ if env is None else env)
    # The child must import this very opperf, wherever the caller runs from.
    package_root = str(Path(__file__).resolve().parents[2])
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, child_env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory(prefix="opperf-replay-") as scratch:
        scratch = Path(scratch)
        attempt = 0
        while remaining:
            attempt += 1
            indices_path = scratch / f"indices_{attempt}.txt"
            progress_path = scratch / f"progress_{attempt}.jsonl"
            stderr_path = scratch / f"stderr_{attempt}.txt"
            indices_path.write_text("".join(f"{i}\n" for i in remaining))
            progress_path.touch()
            command = settings.command(indices_path, progress_path)
            if wrap_command is not None:
                command = wrap_command(command, attempt)
            log.debug("replay child %d: %s", attempt, " ".join(command))
            with open(stderr_path, "wb") as stderr:
                if server is not None and wrap_command is None:
                    from opperf.replay import server as replay_server

                    try:
                        process = replay_server.call(command[3:], env=child_env, cwd=cwd, **server)
                    except RuntimeError as exc:
                        stderr.write(str(exc).encode())
                        process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
                    else:
                        stderr_path = process.log_path
                else:
                    process = subprocess.Popen(command, stdout=stderr, stderr=subprocess.STDOUT, env=child_env,
                                               cwd=cwd, start_new_session=True)
                current, started_at, offset, failure, started_any, stopped = None, None, 0, None, False, ""
                definition_error = None
                while True:
                    exited = process.poll() is not None
                    with open(progress_path, encoding="utf-8") as progress:
                        progress.seek(offset)
                        chunk = progress.read()
                    complete = chunk[:chunk.rfind("\n") + 1] if "\n" in chunk else ""
                    offset += len(complete.encode("utf-8"))
                    for line in complete.splitlines():
                        record = json.loads(line)
                        if record["event"] == "start":
                            current, started_at = record["index"], time.monotonic()
                            started_any = True
                        elif record["event"] == "measured":     # its samples come with its batch
                            current, started_at = None, None
                            measured.add(record["index"])
                        elif record["event"] == "definition_error":
                            definition_error = OpperfError(record["message"], path=settings.definition_path,
                                                           row=record.get("line"), field=record["field"])
                        elif record["event"] == "stats":
                            log.info("%s: replay process: imports %.2f s, setup %.2f s, %d rows in %.2f s "
                                     "(of which collecting samples %.2f s)", settings.kernel_type,
                                     record["import_s"], record["setup_s"], record["rows"], record["rows_s"],
                                     record["collect_s"])
                        else:
                            outcome = RowOutcome.from_json(record["outcome"])
                            outcomes[record["index"]] = outcome
                            remaining.remove(record["index"])
                            if current == record["index"]:
                                current, started_at = None, None
                            if stop_on_failure and outcome.status in FAILED_STATUSES:
                                _kill_group(process)
                                stopped = f"--fail-fast: stopped after line {record['index'] + 2} failed"
                                break
                    row_progress.update(len(measured | outcomes.keys()))
                    if stopped:
                        break
                    if exited:
                        break
                    if current is not None and time.monotonic() - started_at > timeout_s:
                        _kill_group(process)
                        failure = (STATUS_FAILED_TIMEOUT, f"row ran longer than the timeout of {timeout_s:g} s; "
                                                          "its replay process was killed")
                        break
                    time.sleep(POLL_INTERVAL_S)
            if definition_error is not None:
                raise definition_error
            if stopped:
                for index in remaining:
                    outcomes[index] = RowOutcome(STATUS_NOT_RUN, error=stopped)
                remaining = []
                break
            if failure is None and process.returncode != 0:
                failure = (STATUS_FAILED_CRASH, f"{_describe_exit(process.returncode)}: {_tail(stderr_path)}")
            if failure is None:
                if remaining:       # exited cleanly without reporting every row: a bug, never a silent loss
                    failure = (STATUS_FAILED_CRASH, f"the replay process exited without reporting these rows: "
                                                    f"{_tail(stderr_path)}")
                    started_any = False
                else:
                    break
            status, message = failure
            log.warning("%s: %s", settings.kernel_type, message)
            if not started_any:
                # Died before starting any row (import error, bad environment): restarting cannot help.
                for index in remaining:
                    outcomes[index] = RowOutcome(STATUS_NOT_RUN, error=f"never started: {message}")
                remaining = []
                break
            if current is not None:
                outcomes[current] = RowOutcome(status, error=message)
                remaining.remove(current)
            restarts += 1
            if remaining and stop_on_failure:
                for index in remaining:
                    outcomes[index] = RowOutcome(STATUS_NOT_RUN, error=f"--fail-fast: stopped after: {message}")
                remaining = []
            if remaining and restarts > max_restarts:
                for index in remaining:
                    outcomes[index] = RowOutcome(STATUS_NOT_RUN, error=f"not replayed: the replay process failed "
                                                                        f"{restarts} times (last: {message})")
                remaining = []
    row_progress.finish(len(outcomes))
    return outcomes
