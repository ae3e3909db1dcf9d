"""Stage 3, the shape grid: model-derived theory rows that widen every kernel type's shape coverage.

config/grid.yaml (patterns, router, value grids) + config/models.yaml (target models) → per kernel type,
parsed rows followed by generated rows (`source=generated`, no performance values). See docs/grid.md.
"""

import importlib

# Imported on first use, so reading models.yaml (opperf.grid.models) does not import pandas with the runner.
_EXPORTS = {"GridConfig": "config", "load_grid_config": "config", "ModelConfig": "models", "load_models": "models",
            "select_models": "models", "GridSettings": "runner", "KernelGridResult": "runner",
            "generate_kernel_rows": "runner", "prepare_settings": "runner", "run_grid": "runner"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
