"""Many states at once and their exports: scans and manifests of many states (:mod:`.states`,
re-exported here, so ``kvfast.dataset.READS`` and the like keep their names), the Parquet export
(:mod:`.export` and its parts :mod:`.export_commit`, :mod:`.export_parquet`, :mod:`.export_progress`,
:mod:`.export_recurrent`, :mod:`.export_types`) and reading an export back (:mod:`.export_read`)."""

from kvfast.dataset.states import (
    ADDED_SCHEMA,
    INDEX_COLS,
    INDEX_SCHEMA,
    READS,
    RECORD_COLS,
    STATE_SUFFIXES,
    STATS_SCHEMAS,
    Paths,
    dump_id,
    expand,
    manifest,
    records,
    scan,
    scan_stats,
    stats_frame,
)

__all__ = [
    "ADDED_SCHEMA",
    "INDEX_COLS",
    "INDEX_SCHEMA",
    "READS",
    "RECORD_COLS",
    "STATE_SUFFIXES",
    "STATS_SCHEMAS",
    "Paths",
    "dump_id",
    "expand",
    "manifest",
    "records",
    "scan",
    "scan_stats",
    "stats_frame",
]
