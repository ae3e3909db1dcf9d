"""Stage 5: the final database directory — per-kernel CSVs in contract order, op_mapping.yaml, a manifest."""
