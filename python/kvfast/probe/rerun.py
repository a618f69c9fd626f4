"""What a probe run into a folder that already holds a run keeps, and what it makes again.

A prompt's state is kept only when the manifest's row says it was made (``status`` ok, its files
still there) with every setting of this run (:data:`SETTINGS`: the model, cache types, flash
attention, context, batching, generation, the llama.cpp build, the queries window) and the same
tokens (shared prefix, prompt text and token ids); otherwise it is made again, and the files of the
state it replaces are removed first, so that no state made with other settings stays under its name.
The manifest's ``rerun`` column says what the last run did with each row (:data:`OUTCOMES`) and
``changed`` which settings differed for a row made again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import polars as pl

#: The manifest's settings a kept state must share with the run (the model's geometry included).
SETTINGS = (
    "model",
    "arch",
    "n_layer",
    "n_head_kv",
    "head_dim_k",
    "head_dim_v",
    "ctk",
    "ctv",
    "fa",
    "n_ctx",
    "parallel",
    "unified",
    "generate",
    "gpu_layers",
    "llama_build",
    "attn_rot",
    "attn_rot_disable_env",
    "queries_window",
)
#: The ``rerun`` column: made for the first time, made again (settings or tokens changed, or its
#: files were missing), kept from an earlier run with the same settings, or a prompt this run was
#: not given (left as the earlier run made it).
OUTCOMES = ("new", "redone", "kept", "other")


def _same_model(a: Any, b: Any) -> bool:
    if not (isinstance(a, str) and isinstance(b, str)):
        return bool(a == b)
    return a == b or (os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b))


def named_file(out: Path, name: Any) -> Path | None:
    """A file the manifest names in the folder (None: it names none, or not a plain name)."""
    if not isinstance(name, str) or not name or Path(name).name != name:
        return None
    return out / name


def changed(
    row: dict[str, Any] | None,
    config: dict[str, Any],
    prefix: list[int],
    text: str | None,
    tokens: list[int],
    out: Path,
    whole_state: bool,
) -> list[str] | None:
    """What differs between a prompt's earlier row and this run: None when there is no earlier
    row, [] when its state can be kept, else the names of what differs (settings, ``shared_prefix``,
    ``prompt``, ``tokens``, or ``status`` / ``files`` when the earlier run left no usable state)."""
    if row is None:
        return None
    why = [
        k
        for k in SETTINGS
        if not (_same_model(row.get(k), config.get(k)) if k == "model" else row.get(k) == config.get(k))
    ]
    if row.get("prefix_tokens") != prefix:
        why.append("shared_prefix")
    if text is not None and row.get("prompt") != text:
        why.append("prompt")
    if row.get("tokens") != tokens:
        why.append("tokens")
    if row.get("status") == "too_long":  # made again only where something above differs
        pass
    elif row.get("status") != "ok":
        why.append("status")
    else:
        if whole_state and row.get("whole_state") is None:
            why.append("whole_state")
        wanted = [row.get("state")] + ([row.get("queries")] if config.get("queries_window") else [])
        files = [named_file(out, n) for n in wanted]
        if any(f is None or not f.exists() for f in files):
            why.append("files")
    return why


def files_of(row: dict[str, Any], out: Path) -> list[Path]:
    """The files a row's state is made of in the folder: the state, its queries sidecar and values."""
    found = [named_file(out, row.get("state")), named_file(out, row.get("queries"))]
    side = found[1]
    if side is not None and side.name.endswith(".json"):
        found.append(side.with_name(side.name.removesuffix(".json") + ".npy"))
    return [f for f in found if f is not None]


def remove(paths: list[Path]) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


def label(df: pl.DataFrame, outcome: dict[str, str], why: dict[str, list[str]]) -> pl.DataFrame:
    """The manifest with its ``rerun`` and ``changed`` columns for this run (rows of prompts this
    run was not given: ``other``, their ``changed`` as an earlier run left it)."""
    ids = df["prompt_id"].to_list()
    before = df["changed"].to_list() if "changed" in df.columns else [[] for _ in ids]
    return df.with_columns(
        pl.Series("rerun", [outcome.get(i, "other") for i in ids], dtype=pl.String),
        pl.Series(
            "changed",
            [why.get(i, [] if i in outcome else b or []) for i, b in zip(ids, before, strict=True)],
            dtype=pl.List(pl.String),
        ),
    )


def summary(df: pl.DataFrame) -> str:
    """One line of what the run did: ``2 new, 1 redone (ctk, ctv), 3 kept``."""
    if "rerun" not in df.columns:
        return ""
    parts = []
    for what in OUTCOMES:
        rows = df.filter(pl.col("rerun") == what)
        if not rows.height:
            continue
        text = f"{rows.height} {what}"
        if what == "redone":
            names = sorted({c for cs in rows["changed"].to_list() for c in cs or []})
            text += f" ({', '.join(names)})" if names else ""
        parts.append(text)
    return ", ".join(parts)
