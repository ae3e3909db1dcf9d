"""Function generators: kernels whose slot layout needs logic a declarative pattern cannot express.

Each generator declares its params (name → kind and default) and yields Candidates from the run's
value grids (`model.attention`, `model.experts`, `tokens`, …). A pattern selects one with
`generator: <name>` and passes `params:`.
"""

from opperf.grid.generators import attention, moe, rope
from opperf.grid.generators.base import Generator

GENERATORS: dict[str, Generator] = {g.name: g for module in (attention, moe, rope) for g in module.GENERATORS}
