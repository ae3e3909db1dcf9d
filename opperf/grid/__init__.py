"""Stage 3, the shape grid: model-derived theory rows that widen every kernel type's shape coverage.

config/grid.yaml (patterns, router, value grids) + config/models.yaml (target models) → per kernel type,
parsed rows followed by generated rows (`source=generated`, no performance values). See docs/grid.md.
"""

from opperf.grid.config import GridConfig, load_grid_config
from opperf.grid.models import ModelConfig, load_models, select_models
from opperf.grid.runner import GridSettings, KernelGridResult, generate_kernel_rows, prepare_settings, run_grid

__all__ = ["GridConfig", "GridSettings", "KernelGridResult", "ModelConfig", "generate_kernel_rows",
           "load_grid_config", "load_models", "prepare_settings", "run_grid", "select_models"]
