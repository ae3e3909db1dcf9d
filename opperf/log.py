"""Levelled logging and timed spans, so every stage's log says what it did and how long it took."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
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
