"""Parse stage: raw profiler output (kernel_details, op_summary, torch.profiler traces) → per-kernel CSVs."""

__all__ = ["parse_profiles"]


def __getattr__(name: str):
    # Imported on first use: the grid reads FIA column names from opperf.parse.fia_metadata and should not
    # pay for polars and numpy, which only the parse itself needs.
    if name == "parse_profiles":
        from opperf.parse.stage import parse_profiles

        return parse_profiles
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
