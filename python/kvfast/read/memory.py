"""What memory a state holds, for ``kvfast info``: attention caches (V-less or not), the recurrent
part of a recurrent or hybrid model, and the layer map (which model layer each cache layer is),
where it is known."""

from __future__ import annotations

from typing import Any

from kvfast.read.opened import OpenState


def kind_of(dump: OpenState) -> str:
    """'kv', 'recurrent', 'hybrid' or 'hybrid iswa': the llama.cpp memory the state was written by
    (of a partial state, the model's memory it is part of)."""
    partial = dump.partial
    if partial is not None:
        if partial.absent == "attention cache":
            return "hybrid"
        return "kv" if dump.recurrent is None else "hybrid iswa"
    if dump.recurrent is None:
        return "kv"
    if not dump.caches:
        return "recurrent"
    return "hybrid iswa" if len(dump.caches) > 1 else "hybrid"


def _v_less(dump: OpenState) -> bool:
    layers = [ly for c in dump.caches for s in c.streams for ly in s.layers]
    return bool(layers) and all(ly.v_type is None for ly in layers)


def layer_map(dump: OpenState) -> list[dict[str, Any]] | None:
    """Per model layer, the cache layers that hold it: ``[{model_layer, records: [(cache, layer,
    kinds)]}]``; None where some cache layer's model layer is not known (a hybrid opened without
    its model)."""
    by: dict[int, list[tuple[int, int, str]]] = {}
    for c in dump.caches:
        for ly in c.layers:
            if ly.model_layer is None:
                return None
            by.setdefault(ly.model_layer, []).append((c.index, ly.index, "k" if ly.v_type is None else "kv"))
    rec = dump.recurrent
    if rec is not None:
        for rl in rec.layers:
            if rl.model_layer is None:
                return None
            by.setdefault(rl.model_layer, []).append((rec.index, rl.index, "rs"))
    return [{"model_layer": ml, "records": by[ml]} for ml in sorted(by)]


def describe(dump: OpenState) -> dict[str, Any]:
    """The memory keys of ``kvfast info --json``."""
    rec = dump.recurrent
    recurrent = None
    if rec is not None:
        s = rec.stream
        recurrent = {
            "index": rec.index,
            "offset": rec.offset,
            "n_layer": rec.n_layer,
            "cells": s.cell_count,
            "pos": [int(p) for p in s.pos],
            "sequences": s.seq_ids,
            "layers": [
                {
                    "layer": ly.index,
                    "model_layer": ly.model_layer,
                    "r_type": ly.r_type,
                    "n_embd_r": ly.n_embd_r,
                    "s_type": ly.s_type,
                    "n_embd_s": ly.n_embd_s,
                    "r_offset": ly.r_offset,
                    "s_offset": ly.s_offset,
                }
                for ly in rec.layers
            ],
        }
    partial = dump.partial
    return {
        "memory": kind_of(dump),
        "partial": None
        if partial is None
        else {"absent": partial.absent, "model_layers": partial.model_layers},
        "rows_on_device": dump.rows_on_device,
        "v_less": _v_less(dump),
        "recurrent": recurrent,
        "layer_map": layer_map(dump),
        "parts": [None if p is None else p.describe() for p in dump.parts],
    }


def print_info(d: dict[str, Any]) -> None:
    """The memory lines of ``kvfast info``."""
    if any(x is not None for x in d.get("parts", [])):
        for i, x in enumerate(d["parts"]):
            print(f"  part       cache {i}: {'not known without --model' if x is None else x}")
    p = d["partial"]
    if p is not None:
        layers = f"model layers {p['model_layers']}" if p["model_layers"] else "no layer"
        print("  partial    written with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY (a context checkpoint): the")
        print(f"             model's {p['absent']} ({layers}) is absent")
    if d["rows_on_device"]:
        print("  rows       not in the bytes: written with LLAMA_STATE_SEQ_FLAGS_ON_DEVICE, every header and")
        print("             cell and no row (llama.cpp kept the rows in its own buffers)")
    if d["v_less"]:
        print("  V-less     an MLA cache: K records only, one head per row (the compressed latent, then")
        print("             the RoPE part); attention computes V from the latent")
    r = d["recurrent"]
    if r is not None:
        cells = r["cells"]
        seqs = sorted({q for ids in r["sequences"] for q in ids})
        who = f"sequences {seqs}" if seqs else "the state's own sequence"
        print(
            f"  recurrent  cache {r['index']} at byte {r['offset']:,}: {cells} cell(s) (one per sequence),"
            f" pos {r['pos']}, {who}; R and S records of {len(r['layers'])} of the model's"
            f" {r['n_layer']} layers"
        )
        print(
            f"      {'layer':>5}  {'model':>5}  {'R':<5}{'values':>8}  {'S':<5}{'values':>8}"
            f"  {'R offset':>12}  {'S offset':>12}"
        )
        for ly in r["layers"]:
            ml = "?" if ly["model_layer"] is None else ly["model_layer"]
            print(
                f"      {ly['layer']:>5}  {ml:>5}  {ly['r_type']:<5}{ly['n_embd_r']:>8}  {ly['s_type']:<5}"
                f"{ly['n_embd_s']:>8}  {ly['r_offset']:>12,}  {ly['s_offset']:>12,}"
            )
    if d["memory"] == "kv":
        return
    lm = d["layer_map"]
    if lm is None:
        print(
            f"  layer map  not in the bytes: a {d['memory']} model's attention and recurrent layers are"
            " the model's to say (give --model, the GGUF)"
        )
        return
    parts = []
    for e in lm:
        held = " + ".join(f"{kinds.upper()} (cache {c} layer {li})" for c, li, kinds in e["records"])
        parts.append(f"{e['model_layer']}: {held}")
    print(f"  layer map  {d['memory']}; model layer " + "; ".join(parts))
