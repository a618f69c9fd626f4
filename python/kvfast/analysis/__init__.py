"""Measuring states: statistics, quantization error and comparisons of one state (:mod:`.measure`,
re-exported here, so ``kvfast.analysis.compare`` and the like keep their names), how two states'
cells are matched (:mod:`.compare_modes`), one state against many (:mod:`.compare_scan`) and the
keep masks of the usual pruning rules (:mod:`.prune`)."""

from kvfast.analysis import prune
from kvfast.analysis.measure import (
    By,
    compare,
    quant_error,
    select,
    simulated_rotation,
    stats,
    summarize,
)
from kvfast.errors import MatchError

__all__ = [
    "By",
    "MatchError",
    "compare",
    "prune",
    "quant_error",
    "select",
    "simulated_rotation",
    "stats",
    "summarize",
]
