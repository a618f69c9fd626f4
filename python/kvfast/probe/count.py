"""Count the tokens of a probe's prompts before running it (``kvfast probe MODEL PROMPTS --count``):
the model's vocabulary alone is loaded (no weights, no context), each prompt tokenized as the runner
tokenizes it, and its cells (shared prefix, prompt, generated tokens) set against what one
sequence of the context holds."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import polars as pl

from kvfast.errors import ModelMismatchError
from kvfast.probe.runner import bindings, load_prompts


class _Vocab:
    """A GGUF model's tokenizer, loaded without its weights."""

    def __init__(self, model: str) -> None:
        L = self.L = bindings()
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.vocab_only = True
        self.model = L.llama_model_load_from_file(os.fsencode(model), mp)
        if not self.model:
            raise ModelMismatchError(f"llama.cpp could not load the vocabulary of {model}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.has_tokenizer = L.llama_vocab_type(self.vocab) != L.LLAMA_VOCAB_TYPE_NONE
        self.path = model

    def close(self) -> None:
        self.L.llama_model_free(self.model)

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        if not self.has_tokenizer:
            raise ModelMismatchError(
                f"{self.path} has no tokenizer: give prompts as token ids (JSONL 'tokens')"
            )
        data = text.encode()
        buf = (self.L.llama_token * (len(data) + 16))()
        n = self.L.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special, False)
        if n < 0:
            buf = (self.L.llama_token * (-n))()
            n = self.L.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special, False)
        return list(buf[: max(n, 0)])


def count(
    model: str | os.PathLike[str],
    prompts: str | os.PathLike[str] | Sequence[str | dict[str, Any]],
    *,
    n_ctx: int = 4096,
    parallel: int = 1,
    unified: bool = True,
    generate: int = 0,
    shared_prefix: str | Sequence[int] | None = None,
) -> pl.DataFrame:
    """Per prompt: ``prompt_id``, ``tokens`` (its own), ``cells`` (with the shared prefix and the
    generated tokens: what its sequence holds), ``room`` (what one sequence of the context holds,
    as :func:`kvfast.probe.run` plans it) and ``fits``."""
    todo = load_prompts(prompts)
    v = _Vocab(os.fspath(model))
    try:
        prefix: list[int] = []
        if shared_prefix is not None:
            prefix = (
                v.tokenize(shared_prefix, True)
                if isinstance(shared_prefix, str)
                else [int(t) for t in shared_prefix]
            )
        ids = [p.tokens if p.tokens is not None else v.tokenize(p.text or "", not prefix) for p in todo]
    finally:
        v.close()
    room = n_ctx if unified else n_ctx // max(parallel, 1)
    cells = [len(prefix) + len(t) + generate for t in ids]
    return pl.DataFrame(
        {
            "prompt_id": [p.id for p in todo],
            "tokens": [len(t) for t in ids],
            "cells": cells,
            "room": [room] * len(todo),
            "fits": [0 < len(t) and c <= room for t, c in zip(ids, cells, strict=True)],
        },
        schema={
            "prompt_id": pl.String,
            "tokens": pl.Int64,
            "cells": pl.Int64,
            "room": pl.Int64,
            "fits": pl.Boolean,
        },
    )
