"""Ascend NPU replay: environment checks, msprof orchestration, op_summary parsing and aggregation.

The replay engine (opperf.replay.engine) runs the calls; on the NPU back end the durations come from
the device's own profiler, not from a host clock: one msprof session per job wraps the replay
process, and the `op_summary_*.csv` it exports is aggregated by (OP Type, row signature).
"""
