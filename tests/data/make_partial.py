"""Make the fixtures of the states the flags of `llama_state_seq_get_data_ext` give, and of empty
sequences:

    cd tests/data && ../../.venv/bin/python make_partial.py [model ...]

Each run decodes PROMPT (make_memories.py) as sequence 0 of a context of two sequences and leaves
sequence 1 empty, then saves, in a folder `<model>-partial`:

- `seq-0.bin`: `llama_state_seq_get_data` (no flag: the whole memory of sequence 0, the reference);
- `seq-0.partial.bin`: `llama_state_seq_get_data_ext(..., LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)`: the
  part of the memory that cannot be recomputed cheaply (llama-server's context checkpoints): a
  hybrid's recurrent part alone, an iSWA model's sliding-window cache alone, a hybrid iSWA model's
  sliding-window cache then its recurrent part; a plain KV cache or a recurrent memory ignores the
  flag;
- `seq-0.device.bin`: `..._ext(..., LLAMA_STATE_SEQ_FLAGS_ON_DEVICE)`: every header and cell, no
  row (llama.cpp keeps the rows in buffers of its own, `mem_storage`, for a later
  `set_data_ext(..., ON_DEVICE)` in the same context); `seq-0.partial-device.bin`: both flags;
- `seq-1.bin`, `seq-1.ggsq` (no token), `seq-1.partial.bin`: the empty sequence 1 (a recurrent part
  with no cell still writes s_trans, n_layer and every R and S record header);
- `state-empty.bin`: `llama_state_get_data` of the context before anything was decoded.

`llama_state_seq_save_file` and the whole-state functions take no flag (llama-cpp-python 0.3.36's
llama.cpp): the flags exist only in the raw sequence bytes. The models are make_memories.py's, and a
tiny Gemma 3 written here (tiny-gemma3.gguf: 4 layers, a sliding window of 4 on layers 0 and 2).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from make_memories import HERE, MODELS, N_CTX, PROMPT, Writer

PARTIAL_ONLY, ON_DEVICE = 1, 2


def gemma3() -> Path:
    """A Gemma 3 of 4 layers whose even layers slide (window 4: 7 tokens leave the window)."""
    n_embd, n_layer, n_head, n_head_kv, head, n_ff = 64, 4, 2, 1, 32, 64
    m = Writer("tiny-gemma3.gguf", "gemma3", 3)
    w, a = m.w, "gemma3"
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head)
    w.add_value_length(head)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(4)
    w.add_uint32(f"{a}.attention.sliding_window_pattern", 2)  # il % 2 < 1: layers 0 and 2 slide
    m.embeddings(n_embd)
    m.ones("output_norm.weight", n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            m.ones(p + norm + ".weight", n_embd)
        m.ones(p + "attn_q_norm.weight", head)
        m.ones(p + "attn_k_norm.weight", head)
        m.mat(p + "attn_q.weight", n_head * head, n_embd)
        m.mat(p + "attn_k.weight", n_head_kv * head, n_embd)
        m.mat(p + "attn_v.weight", n_head_kv * head, n_embd)
        m.mat(p + "attn_output.weight", n_embd, n_head * head)
        m.ffn(p, n_embd, n_ff)
    m.close()
    return m.path


def existing(name: str) -> Callable[[], Path]:
    """A model make_memories.py wrote, as it is in models/."""

    def get() -> Path:
        path = MODELS / name
        if not path.exists():
            sys.exit(f"{path} is missing: run make_memories.py first")
        return path

    return get


def seq_bytes(L: object, ctx: object, seq: int, flags: int) -> bytes:
    n = L.llama_state_seq_get_size_ext(ctx, seq, flags)  # type: ignore[attr-defined]
    buf = (ctypes.c_uint8 * max(n, 1))()
    got = L.llama_state_seq_get_data_ext(ctx, buf, n, seq, flags)  # type: ignore[attr-defined]
    if got != n:
        raise RuntimeError(f"llama_state_seq_get_data_ext wrote {got} of {n} bytes (flags {flags})")
    return bytes(buf[:got])


def write_states(model: Path, memory: str, folder: str) -> None:
    from kvfast.probe import Runner

    if os.environ.get("LLAMA_ATTN_ROT_DISABLE"):
        sys.exit("LLAMA_ATTN_ROT_DISABLE is set: the fixtures must be written as llama.cpp does by default")
    out = HERE / folder
    out.mkdir(exist_ok=True)
    r = Runner(str(model), ctk="f16", ctv="f16", fa=True, parallel=2, n_ctx=N_CTX, gpu_layers=0, unified=True)
    try:
        L, ctx = r.L, r.ctx
        r.save_whole(out / "state-empty.bin")
        r.decode([(t, i, 0, i == len(PROMPT) - 1) for i, t in enumerate(PROMPT)])
        (out / "seq-0.bin").write_bytes(seq_bytes(L, ctx, 0, 0))
        (out / "seq-0.partial.bin").write_bytes(seq_bytes(L, ctx, 0, PARTIAL_ONLY))
        (out / "seq-0.device.bin").write_bytes(seq_bytes(L, ctx, 0, ON_DEVICE))
        (out / "seq-0.partial-device.bin").write_bytes(seq_bytes(L, ctx, 0, PARTIAL_ONLY | ON_DEVICE))
        (out / "seq-1.bin").write_bytes(seq_bytes(L, ctx, 1, 0))
        (out / "seq-1.partial.bin").write_bytes(seq_bytes(L, ctx, 1, PARTIAL_ONLY))
        r.save_seq(out / "seq-1.ggsq", 1, [])
    finally:
        r.close()
    files = {f.name: f.stat().st_size for f in sorted(out.iterdir()) if f.name != "probe.json"}
    probe = {
        "model": model.name,
        "memory": memory,
        "ctk": "f16",
        "ctv": "f16",
        "fa": "on",
        "n_ctx": N_CTX,
        "n_seq_max": 2,
        "unified": True,
        "seqs": [PROMPT, []],
        "flags": {"partial": PARTIAL_ONLY, "device": ON_DEVICE, "partial-device": PARTIAL_ONLY | ON_DEVICE},
        "files": files,
    }
    (out / "probe.json").write_text(json.dumps(probe, indent=1) + "\n")
    print(out.name, files)


# model -> (its writer, llama.cpp's memory, folder)
RUNS: dict[str, tuple[Callable[[], Path], str, str]] = {
    "gemma3": (gemma3, "kv iswa", "gemma3tiny-partial"),
    "qwen35": (existing("tiny-qwen35.gguf"), "hybrid", "qwen35tiny-partial"),
    "lfm2": (existing("tiny-lfm2.gguf"), "hybrid", "lfm2tiny-partial"),
    "lfm2-swa": (existing("tiny-lfm2-swa.gguf"), "hybrid iswa", "lfm2swatiny-partial"),
    "mamba2": (existing("tiny-mamba2.gguf"), "recurrent", "mamba2tiny-partial"),
    "qwen3": (existing("tiny-qwen3.gguf"), "kv", "qwen3tiny-partial"),
}


if __name__ == "__main__":
    for key in sys.argv[1:] or list(RUNS):
        make, memory, folder = RUNS[key]
        path = make()
        print(path.name, path.stat().st_size, "bytes")
        write_states(path, memory, folder)
