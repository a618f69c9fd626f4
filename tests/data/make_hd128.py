"""Make the head-size-128 fixtures: tiny-qwen3-hd128.gguf and the qwen3hd128-* state folders.

    cd tests/data && ../../.venv/bin/python make_hd128.py

The model: qwen3, 2 layers, 4 heads, 2 KV heads, key_length = value_length = 128, embedding 64,
vocabulary 256, no tokenizer, random weights (seeded) with a few planted outlier channels (large
attn_k_norm weights in K, large attn_v rows in V), as real models have. With head size 128, llama.cpp
(since April 2026) stores a quantized K rotated in Hadamard groups of 128 and V in groups of 64.

The states: one 9-token prompt decoded on the CPU with flash attention, once per cache type, each
saved through the four C API calls (see README.md), by llama-cpp-python's bindings (llama.cpp of
October 2026). Values depend on the CPU's arithmetic, so a rerun may differ in the last bits; the
tests compare files with each other, never with constants.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

import gguf
import numpy as np

HERE = Path(__file__).resolve().parent
MODEL = HERE / "models" / "tiny-qwen3-hd128.gguf"
PROMPT = [68, 32, 130, 60, 253, 230, 241, 194, 107]
N_CTX = 256
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD, N_FF, N_VOCAB = 64, 2, 4, 2, 128, 64, 256
K_OUTLIERS = {5: 12.0, 61: 9.0, 125: 10.0}  # channel of each head -> attn_k_norm weight
V_OUTLIERS = {7: 8.0, 100: 10.0}  # channel of each head -> scale of its attn_v row
# (folder suffix, K type, V type)
RUNS = [("f16", "f16", "f16"), ("q8_0", "q8_0", "q8_0"), ("q4_0-q4_1", "q4_0", "q4_1")]


def write_model(path: Path = MODEL) -> None:
    rng = np.random.default_rng(128)

    def mat(rows: int, cols: int) -> np.ndarray:  # GGUF shape [cols, rows]; y = W x with x of size cols
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, np.float32)

    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_name("tiny-qwen3-l2-kv2x128")
    w.add_vocab_size(N_VOCAB)
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD)
    w.add_value_length(HEAD)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("none")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tensor("token_embd.weight", rng.standard_normal((N_VOCAB, N_EMBD)).astype(np.float32))
    w.add_tensor("output_norm.weight", ones(N_EMBD))
    k_norm = ones(HEAD)
    for ch, g in K_OUTLIERS.items():
        k_norm[ch] = g
    for i in range(N_LAYER):
        v = mat(N_HEAD_KV * HEAD, N_EMBD)
        for h in range(N_HEAD_KV):
            for ch, g in V_OUTLIERS.items():
                v[h * HEAD + ch] *= np.float16(g)
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones(N_EMBD))
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(N_HEAD * HEAD, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(N_HEAD_KV * HEAD, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_v.weight", v)
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(N_EMBD, N_HEAD * HEAD))
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", ones(HEAD))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", k_norm)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones(N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(N_EMBD, N_FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_states(name: str, ctk: str, ctv: str) -> None:
    from kvfast.probe import Runner

    out = HERE / f"qwen3hd128-{name}-fa"
    out.mkdir(exist_ok=True)
    if os.environ.get("LLAMA_ATTN_ROT_DISABLE"):
        sys.exit("LLAMA_ATTN_ROT_DISABLE is set: the fixtures must be written as llama.cpp does by default")
    r = Runner(str(MODEL), ctk=ctk, ctv=ctv, fa=True, parallel=1, n_ctx=N_CTX, gpu_layers=0, unified=True)
    try:
        r.decode([(t, i, 0, i == len(PROMPT) - 1) for i, t in enumerate(PROMPT)])
        L, ctx = r.L, r.ctx
        toks = (L.llama_token * len(PROMPT))(*PROMPT)
        n = L.llama_state_seq_get_size(ctx, 0)
        buf = (ctypes.c_uint8 * n)()
        got = L.llama_state_seq_get_data(ctx, buf, n, 0)
        (out / "seq-0.bin").write_bytes(bytes(buf[:got]))
        if not L.llama_state_seq_save_file(ctx, os.fsencode(out / "seq-0.ggsq"), 0, toks, len(PROMPT)):
            raise RuntimeError("llama_state_seq_save_file failed")
        r.save_whole(out / "state.bin")
        if not L.llama_state_save_file(ctx, os.fsencode(out / "state.ggsn"), toks, len(PROMPT)):
            raise RuntimeError("llama_state_save_file failed")
    finally:
        r.close()
    files = {f: (out / f).stat().st_size for f in ("seq-0.bin", "seq-0.ggsq", "state.bin", "state.ggsn")}
    probe = {
        "model": MODEL.name,
        "ctk": ctk,
        "ctv": ctv,
        "fa": "on",
        "n_ctx": N_CTX,
        "unified": True,
        "seqs": [PROMPT],
        "files": files,
    }
    (out / "probe.json").write_text(json.dumps(probe, indent=1) + "\n")
    print(out.name, files)


if __name__ == "__main__":
    write_model()
    print(MODEL.name, MODEL.stat().st_size, "bytes")
    for name, ctk, ctv in RUNS:
        write_states(name, ctk, ctv)
