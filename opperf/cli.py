"""What every script under scripts/ shares: logging flags and the one-line error exit."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from opperf.errors import OpperfError
from opperf.log import setup_logging

EXIT_BAD_INPUT = 2


def add_logging_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None,
                        help="log detail (default: info, or $OPPERF_LOG_LEVEL)")


def run_cli(parser: argparse.ArgumentParser, main: Callable[[argparse.Namespace], int | None],
            argv: Sequence[str] | None = None) -> int:
    """Parse args, set up logging, call `main`; an OpperfError becomes one line on stderr and exit code 2."""
    args = parser.parse_args(argv)
    setup_logging(getattr(args, "log_level", None))
    try:
        return int(main(args) or 0)
    except OpperfError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
