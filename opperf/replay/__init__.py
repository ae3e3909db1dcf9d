"""Replay engine: re-measure every database row on the device and write it back by signature."""
