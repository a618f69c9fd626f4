"""Writing states with llama.cpp (llama-cpp-python, imported when used): decoding prompts and saving
their states (:mod:`.runner`: ``kvfast.probe.run`` and the runner's other names are read from it),
the same in a child process (:mod:`.guard`), the manifest of a probe folder (:mod:`.manifest`, which
opening a state reads) and loading a state back into a context (:mod:`.replay`).

The runner is imported when one of its names is first read, not with the package: opening a state
reads the manifest and so imports this package, and must not import the runner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvfast.probe.runner import GGML_LOG_LEVEL_ERROR, MANIFEST, Prompt, Runner, load_prompts, run

__all__ = ["GGML_LOG_LEVEL_ERROR", "MANIFEST", "Prompt", "Runner", "load_prompts", "run"]

if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        if name in __all__:
            return getattr(importlib.import_module("kvfast.probe.runner"), name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
