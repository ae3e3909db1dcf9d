"""Parse stage: raw profiler output (kernel_details, op_summary, torch.profiler traces) → per-kernel CSVs."""

from opperf.parse.stage import parse_profiles

__all__ = ["parse_profiles"]
