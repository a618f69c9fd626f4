"""Make the fixtures of the no-model rotation decision: two tiny qwen3 models of 4 KV heads x 128
(K rows of 512 values: groups of 64, 128, 256 and 512 all fit) and their q8_0 states, in
meankey/ (a folder of its own: one container each, not the four of the other fixture folders).

    cd tests/data && ../../.venv/bin/python make_mean_key.py

Both models: 2 layers, 4 heads, 4 KV heads, key_length = value_length = 128, embedding 64,
vocabulary 256, no tokenizer, random weights (seeded), planted outlier K channels (large
attn_k_norm weights at low-frequency channels, as make_hd128.py). tiny-qwen3-meankey.gguf also has
what real models have and random weights lack: a massive activation, one residual channel large and
of one sign in every token's embedding, so every token's key shares a mean (the common direction
real keys have). With it llama.cpp's NEOX RoPE visibly turns the mean of each head's first pairs
from one cell to the next, which tells the head size and so K's group (rope_pairs.rs); without it
(tiny-qwen3-nomean.gguf) nothing in the values tells the group, and kvfast must say so.

The models are not kept (the tests give head_dim=128). The states: one 64-token prompt decoded on the CPU with flash attention, q8_0 K and V, saved with
llama_state_seq_get_data (llama.cpp of October 2026; q8_0: K rotated in groups of 128, V in 64);
f16 for the model with the mean key, the reference.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import gguf
import numpy as np

HERE = Path(__file__).resolve().parent
PROMPT = [int(t) for t in np.random.default_rng(64).integers(1, 256, 64)]
N_EMBD, N_LAYER, N_HEAD, HEAD, N_FF, N_VOCAB = 64, 2, 4, 128, 64, 256
K_OUTLIERS = {40: 12.0, 50: 9.0, 110: 10.0}  # channel of each head -> attn_k_norm weight


def write_model(path: Path, mean: bool) -> None:
    rng = np.random.default_rng(4128)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, np.float32)

    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_name(path.stem)
    w.add_vocab_size(N_VOCAB)
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_key_length(HEAD)
    w.add_value_length(HEAD)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("none")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    embd = rng.standard_normal((N_VOCAB, N_EMBD)).astype(np.float32)
    if mean:
        embd[:, 0] = 8.0  # the massive activation
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", ones(N_EMBD))
    k_norm = ones(HEAD)
    for ch, g in K_OUTLIERS.items():
        k_norm[ch] = g
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones(N_EMBD))
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(N_HEAD * HEAD, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(N_HEAD * HEAD, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(N_HEAD * HEAD, N_EMBD))
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


def write_state(model: Path, out: Path, ty: str) -> None:
    from kvfast.probe import Runner

    out.mkdir(parents=True, exist_ok=True)
    r = Runner(str(model), ctk=ty, ctv=ty, fa=True, parallel=1, n_ctx=256, gpu_layers=0, unified=True)
    try:
        r.decode([(t, i, 0, i == len(PROMPT) - 1) for i, t in enumerate(PROMPT)])
        n = r.L.llama_state_seq_get_size(r.ctx, 0)
        buf = (ctypes.c_uint8 * n)()
        got = r.L.llama_state_seq_get_data(r.ctx, buf, n, 0)
        (out / "seq-0.bin").write_bytes(bytes(buf[:got]))
    finally:
        r.close()
    probe = {
        "model": model.name,
        "ctk": ty,
        "ctv": ty,
        "fa": "on",
        "n_ctx": 256,
        "unified": True,
        "seqs": [PROMPT],
        "files": {"seq-0.bin": (out / "seq-0.bin").stat().st_size},
    }
    (out / "probe.json").write_text(json.dumps(probe, indent=1) + "\n")


if __name__ == "__main__":
    for name, mean in (("meankey", True), ("nomean", False)):
        model = HERE / "models" / f"tiny-qwen3-{name}.gguf"
        write_model(model, mean)
        for ty in ("f16", "q8_0") if mean else ("q8_0",):
            write_state(model, HERE / "meankey" / f"qwen3{name}-{ty}-fa", ty)
        model.unlink()  # the tests need only its geometry (head_dim=128)
