"""Collective benchmarks (stage 6): all_reduce, all_gather, reduce_scatter, all_to_all over message sizes,
device counts and topology tiers, on gloo (CPU), NCCL (CUDA) and HCCL (Ascend NPU).

Modules: `topology` (rank coordinates, tiers, groups), `sizes` (byte grids, dtypes), `collectives`
(what each op moves, its known input pattern and check, file names), `timing` (event/kernel timers per
back end), `results` (the CSV schema and statistics), `bench` (the torchrun driver), `alignment`
(point-by-point comparison of two collective CSVs).
"""
