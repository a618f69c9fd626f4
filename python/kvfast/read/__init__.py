"""Opening one state and what it holds: the state (:mod:`.state`), the options many states are
opened with (:mod:`.opening`), its caches, layers and streams
(:mod:`.structure`), where a value lies in the file (:mod:`.address`, :mod:`.hexview`), the checks of
selections (:mod:`.select`), remote reads (:mod:`.remote`), token text (:mod:`.tokens`), the ggml
types (:mod:`.ggml`, :mod:`.floats`), the index columns' types (:mod:`.schema`) and the memory
kinds (:mod:`.memory`)."""
