"""How a database answers one query of a performance model: the one status type of the consumer's answers (opperf's
model of the runtime, msmodeling's own runtime, its gate, a prediction), and the groupings readers need.

A `StrEnum`: a member is its name as a string, so JSON, tables and comparisons with the plain names read the same
as before the type existed (`f"{AnswerStatus.MISS}"` is `MISS`)."""

from __future__ import annotations

import enum


class AnswerStatus(enum.StrEnum):
    """EXACT (a row), ZERO_COST (op_mapping says no kernel runs), INTERPOLATED (legally), ILLEGAL (interpolated
    across buckets or axes), MISS (the runtime's roofline fallback), DTYPE_UNMAPPED (a roofline fallback no database
    can prevent: a dtype the runtime cannot spell), RAISES (the runtime raises: a model run stops), UNMODELLED (a
    runtime path opperf's model does not follow)."""

    EXACT = "EXACT"
    ZERO_COST = "ZERO_COST"
    INTERPOLATED = "INTERPOLATED"
    ILLEGAL = "ILLEGAL"
    MISS = "MISS"
    DTYPE_UNMAPPED = "DTYPE_UNMAPPED"
    RAISES = "RAISES"
    UNMODELLED = "UNMODELLED"

    @property
    def fails_gate(self) -> bool:
        """A performance model cannot use the answer: a roofline fallback the database could have prevented, a
        cross-bucket interpolation, an exception, or a path opperf's model does not follow (the database check's
        consumer gates)."""
        return self in _FAILING

    @property
    def prediction_group(self) -> AnswerStatus:
        """The PREDICTION_STATUSES member a prediction counts the answer under: a zero-cost answer is measured
        (EXACT); every answer without a latency is priced at the roofline (MISS)."""
        return _PREDICTION_GROUP.get(self, AnswerStatus.MISS)


_FAILING = frozenset({AnswerStatus.MISS, AnswerStatus.ILLEGAL, AnswerStatus.RAISES, AnswerStatus.UNMODELLED})
_PREDICTION_GROUP = {AnswerStatus.EXACT: AnswerStatus.EXACT, AnswerStatus.ZERO_COST: AnswerStatus.EXACT,
                     AnswerStatus.INTERPOLATED: AnswerStatus.INTERPOLATED, AnswerStatus.ILLEGAL: AnswerStatus.ILLEGAL}
# What a prediction reports a step's time under, in its tables' order.
PREDICTION_STATUSES = (AnswerStatus.EXACT, AnswerStatus.INTERPOLATED, AnswerStatus.ILLEGAL, AnswerStatus.MISS)
# What msmodeling's own data sources answer (opperf.consumer.msmodeling_gate), in its table's order.
MSMODELING_STATUSES = (AnswerStatus.EXACT, AnswerStatus.INTERPOLATED, AnswerStatus.ZERO_COST, AnswerStatus.MISS,
                       AnswerStatus.RAISES)
