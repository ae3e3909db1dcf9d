#!/usr/bin/env python
"""Backfill the `Runtime …` columns of a FusedInferAttentionScore.csv from a JSONL log of FIA calls.

Each JSONL line is one FIA call: {"input_shapes": "a,b,c;...", "actual_seq_lengths": [...],
"actual_seq_lengths_kv": [...], optional "block_table_valid_blocks", "num_heads", "num_key_value_heads",
"sparse_mode", "input_layout", "block_size", "attn_state", "kv_cache_mode"} (or the peer's form with
query_shape/key_shape/value_shape/atten_mask_shape/block_table_shape instead of input_shapes). Rows are
matched by input signature; unmatched rows keep their runtime columns and are counted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, run_cli  # noqa: E402
from opperf.parse.fia_metadata import COMPLETENESS_RUNTIME, fill_fia_runtime_metadata  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="exit codes: 0 ok, 2 bad input (one line on stderr names file/line/field)")
    parser.add_argument("--csv-path", required=True, type=Path, help="FusedInferAttentionScore.csv to backfill")
    parser.add_argument("--jsonl-path", required=True, type=Path, help="JSONL runtime log (one object per FIA call)")
    parser.add_argument("--output-path", type=Path, default=None,
                        help="where to write the result (default: replace --csv-path, atomically)")
    parser.add_argument("--metadata-tag", default=COMPLETENESS_RUNTIME,
                        help="value of 'Runtime metadata_completeness' on matched rows (default: %(default)s)")
    add_logging_args(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    result = fill_fia_runtime_metadata(args.csv_path, args.jsonl_path, args.output_path, args.metadata_tag)
    print(f"backfilled {result.matched}/{result.rows} rows into {result.output_path} "
          f"({result.unmatched} unmatched, their runtime columns left as they were)")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
