"""What every script under scripts/ shares: logging flags and the one-line error exit."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from opperf.errors import OpperfError, os_error_line
from opperf.io import all_or_nothing
from opperf.log import get_logger, setup_logging

EXIT_BAD_INPUT = 2


def positive_int(text: str) -> int:
    """argparse type of counts that must be at least 1 (argparse turns the ArgumentTypeError into a usage error, exit 2)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text}")
    return value


def add_logging_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None,
                        help="log detail (default: info, or $OPPERF_LOG_LEVEL)")


def run_cli(parser: argparse.ArgumentParser, main: Callable[[argparse.Namespace], int | None],
            argv: Sequence[str] | None = None) -> int:
    """Parse args, set up logging, call `main`; bad input (OpperfError) or an OS fault (OSError: disk full,
    read-only, no permission) becomes one line on stderr and exit code 2, and the outputs the failed run
    had created are removed (`all_or_nothing`)."""
    args = parser.parse_args(argv)
    setup_logging(getattr(args, "log_level", None))
    try:
        with all_or_nothing():
            return int(main(args) or 0)
    except OpperfError as exc:
        message = str(exc)
    except OSError as exc:
        get_logger("cli").debug("OS error", exc_info=True)
        message = os_error_line(exc)
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT
