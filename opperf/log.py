"""Levelled logging and timed spans, so every stage's log says what it did and how long it took."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator

LOGGER_NAME = "opperf"


def utc_timestamp() -> str:
    """Now, as every stage writes `collected_at`: ISO 8601 in UTC with a trailing Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def setup_logging(level: str | None = None) -> logging.Logger:
    """`info` by default; `debug` via --log-level or OPPERF_LOG_LEVEL."""
    level = (level or os.environ.get("OPPERF_LOG_LEVEL") or "info").upper()
    logger = logging.getLogger(LOGGER_NAME)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-5s %(name)s: %(message)s",
                                               datefmt="%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(getattr(logging, level, logging.INFO))
    return logger


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"{LOGGER_NAME}.{name}")


@contextlib.contextmanager
def span(name: str, logger: logging.Logger | None = None, **fields) -> Iterator[dict]:
    """Time a stage: logs `span <name> start` / `span <name> done in X.XXXs`; yields a dict for result fields."""
    logger = logger or get_logger("span")
    detail = " ".join(f"{k}={v}" for k, v in fields.items())
    logger.debug("span %s start %s", name, detail)
    result: dict = {}
    start = time.perf_counter()
    try:
        yield result
    finally:
        elapsed = time.perf_counter() - start
        extra = " ".join(f"{k}={v}" for k, v in result.items())
        logger.info("span %s done in %.3fs %s %s", name, elapsed, detail, extra)


def _duration_text(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    """Long work's progress in its log and on the terminal: `progress <what>: 120/403 rows (29.8 %), 4.1 rows/s,
    ETA 1m09s`, at most once per `interval_s` (default $OPPERF_PROGRESS_INTERVAL_S, else 10 s), and a last line
    when work that printed any is done. With interval 0 every change of the count is printed."""

    def __init__(self, logger: logging.Logger, what: str, total: int, *, unit: str = "rows",
                 interval_s: float | None = None):
        self.logger, self.what, self.total, self.unit = logger, what, total, unit
        self.interval_s = float(os.environ.get("OPPERF_PROGRESS_INTERVAL_S", "10")) if interval_s is None \
            else interval_s
        self.started = self.last = time.monotonic()
        self.last_done = 0
        self.printed = False

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last < self.interval_s or (self.interval_s == 0 and done == self.last_done):
            return
        self._print(done, now)

    def finish(self, done: int) -> None:
        if self.printed and done != self.last_done:
            self._print(done, time.monotonic())

    def _print(self, done: int, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        rate = done / elapsed
        share = f" ({100 * done / self.total:.1f} %)" if self.total else ""
        eta = f", ETA {_duration_text((self.total - done) / rate)}" if rate > 0 and done < self.total else ""
        self.logger.info("progress %s: %d/%d %s%s, %.2f %s/s, elapsed %s%s", self.what, done, self.total, self.unit,
                         share, rate, self.unit, _duration_text(elapsed), eta)
        self.last, self.last_done, self.printed = now, done, True


# What torch's C++ side prints to stderr around every torch.profiler session: kineto's USDT probe markers
# and the execution trace observer's "Enabling/Disabling" notes. They say nothing a log reader can use.
PROFILER_NOISE = re.compile(r"^(?:USDT:.*\] profiler_(?:start|stop)"
                            r"|\[W.*execution_trace_observer\.cpp:\d+\] (?:Enabling|Disabling) Execution Trace Observer)"
                            r"\s*$")


@contextlib.contextmanager
def stderr_without(noise: re.Pattern = PROFILER_NOISE) -> Iterator[None]:
    """Run the block with file descriptor 2 (where C++ code writes, bypassing Python's logging) captured, then
    write what it wrote back to stderr, in order, without the lines matching `noise`.

    Everything else, Python's log lines of the block included, comes through; only later than it was written.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode("utf-8", errors="replace")
            kept = "".join(line for line in text.splitlines(keepends=True) if not noise.match(line))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()
