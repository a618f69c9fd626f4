"""Measuring states: statistics, quantization error and comparisons of one state (:mod:`.measure`,
re-exported here, so ``kvfast.analysis.compare`` and the like keep their names), how two states'
cells are matched (:mod:`.compare_modes`), one state against many (:mod:`.compare_scan`) and the
keep masks of the usual pruning rules (:mod:`.prune`)."""

from kvfast.analysis import prune
from kvfast.analysis.measure import (
    LOSS_COLUMNS,
    By,
    compare,
    quant_error,
    select,
    simulated_rotation,
    stats,
)
from kvfast.errors import MatchError

__all__ = [
    "LOSS_COLUMNS",
    "By",
    "MatchError",
    "compare",
    "prune",
    "quant_error",
    "select",
    "simulated_rotation",
    "stats",
]
