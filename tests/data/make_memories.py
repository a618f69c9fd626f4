"""Make the fixtures of memories other than a plain KV cache: a V-less MLA cache, a recurrent
memory, and hybrids (an attention cache, then a recurrent part).

    cd tests/data && ../../.venv/bin/python make_memories.py [model ...]

Every model is tiny, with random weights (seeded), no tokenizer, written with the `gguf` package with
the hyperparameters and tensors llama.cpp's loader asks for (src/models/<arch>.cpp in llama-cpp-python
0.3.36's llama.cpp), and run by llama.cpp itself through llama-cpp-python's C API on the CPU:

- tiny-deepseek2-mla.gguf (deepseek2, 2 layers, 4 heads, kv_lora_rank 128 + RoPE 64, with the
  `*_mla` key/value lengths): llama.cpp keeps a V-less MLA cache, one 192-value K row per cell and
  layer (latent + RoPE part, as DeepSeek's 576 = 512 + 64) and no V record.
- tiny-mamba2.gguf (mamba2, 2 layers, d_inner 128, d_state 16, 1 group, d_conv 4): recurrent memory
  only; per layer an R record (conv state, 3 x 160 values) and an S record (SSM state, 16 x 128).
- tiny-qwen35.gguf (qwen35, 4 layers, full attention every 4th: layers 0-2 gated delta net, layer 3
  attention with M-RoPE, so the attention cells carry the 12-byte extension): hybrid memory.
- tiny-lfm2.gguf (lfm2, 5 layers, short convolutions at 0, 1, 3 and attention at 2 and 4): hybrid
  memory whose S records are empty (LFM2 keeps only a conv state).
- tiny-lfm2-swa.gguf (the same with a sliding window of 4): hybrid iSWA memory: a full-attention
  cache with no layer (every attention layer slides), the sliding-window cache, then the recurrent part.

Recurrent states are F32 whatever the cache types (llama_model::create_memory); the attention part
takes the cache types. Values depend on the CPU's arithmetic; the tests compare files with an
independent reading of the same files, never with constants.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

HERE = Path(__file__).resolve().parent
MODELS = HERE / "models"
PROMPT = [68, 32, 130, 60, 253, 230, 241]
PROMPT_1 = [17, 99, 4, 200, 31]  # the second sequence of the two-sequence runs
N_CTX = 256
N_VOCAB = 256


class Writer:
    """A GGUF writer with the seeded random tensors every model uses."""

    def __init__(self, name: str, arch: str, seed: int) -> None:
        self.path = MODELS / name
        self.rng = np.random.default_rng(seed)
        self.w = gguf.GGUFWriter(str(self.path), arch)
        self.w.add_name(name.removesuffix(".gguf"))
        self.w.add_vocab_size(N_VOCAB)
        self.w.add_context_length(4096)
        self.w.add_layer_norm_rms_eps(1e-6)
        self.w.add_tokenizer_model("none")
        self.w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    def mat(self, name: str, rows: int, cols: int) -> None:
        """An f16 matrix y = W x with x of size cols (GGUF shape [cols, rows])."""
        w = self.rng.standard_normal((rows, cols)) / np.sqrt(cols)
        self.w.add_tensor(name, w.astype(np.float16))

    def f32(self, name: str, *shape: int, scale: float = 1.0) -> None:
        self.w.add_tensor(name, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def ones(self, name: str, *shape: int) -> None:
        self.w.add_tensor(name, np.ones(shape, np.float32))

    def embeddings(self, n_embd: int) -> None:
        self.f32("token_embd.weight", N_VOCAB, n_embd)

    def ffn(self, p: str, n_embd: int, n_ff: int) -> None:
        self.mat(p + "ffn_gate.weight", n_ff, n_embd)
        self.mat(p + "ffn_up.weight", n_ff, n_embd)
        self.mat(p + "ffn_down.weight", n_embd, n_ff)

    def close(self) -> None:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()


def deepseek2_mla() -> Path:
    n_embd, n_layer, n_head, n_ff = 64, 2, 4, 64
    kv_lora, rope, nope, head_v, q_lora = 128, 64, 32, 32, 32
    m = Writer("tiny-deepseek2-mla.gguf", "deepseek2", 19067)
    w, a = m.w, "deepseek2"
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(1)
    # the cache's head: the compressed latent and the RoPE part, one head (V is the latent)
    w.add_key_length(kv_lora + rope)
    w.add_value_length(kv_lora)
    w.add_uint32(f"{a}.attention.key_length_mla", nope + rope)
    w.add_uint32(f"{a}.attention.value_length_mla", head_v)
    w.add_rope_dimension_count(rope)
    w.add_rope_freq_base(10000.0)
    w.add_q_lora_rank(q_lora)
    w.add_kv_lora_rank(kv_lora)
    w.add_leading_dense_block_count(n_layer)  # every layer dense: no experts
    w.add_expert_feed_forward_length(n_ff)
    w.add_expert_shared_count(0)
    m.embeddings(n_embd)
    m.ones("output_norm.weight", n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        m.ones(p + "attn_norm.weight", n_embd)
        m.ones(p + "attn_q_a_norm.weight", q_lora)
        m.ones(p + "attn_kv_a_norm.weight", kv_lora)
        m.mat(p + "attn_q_a.weight", q_lora, n_embd)
        m.mat(p + "attn_q_b.weight", n_head * (nope + rope), q_lora)
        m.mat(p + "attn_kv_a_mqa.weight", kv_lora + rope, n_embd)
        kb = m.rng.standard_normal((n_head, kv_lora, nope)) / np.sqrt(nope)  # {nope, kv_lora, n_head}
        w.add_tensor(p + "attn_k_b.weight", kb.astype(np.float16))
        vb = m.rng.standard_normal((n_head, head_v, kv_lora)) / np.sqrt(kv_lora)  # {kv_lora, head_v, n_head}
        w.add_tensor(p + "attn_v_b.weight", vb.astype(np.float16))
        m.mat(p + "attn_output.weight", n_embd, n_head * head_v)
        m.ones(p + "ffn_norm.weight", n_embd)
        m.ffn(p, n_embd, n_ff)
    m.close()
    return m.path


def mamba2() -> Path:
    n_embd, n_layer = 64, 2
    d_inner, d_state, n_group, dt_rank, d_conv = 128, 16, 1, 4, 4
    conv = d_inner + 2 * n_group * d_state
    m = Writer("tiny-mamba2.gguf", "mamba2", 2312)
    w = m.w
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    w.add_ssm_group_count(n_group)
    m.embeddings(n_embd)
    m.ones("output_norm.weight", n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        m.ones(p + "attn_norm.weight", n_embd)
        m.mat(p + "ssm_in.weight", d_inner + conv + dt_rank, n_embd)
        m.f32(p + "ssm_conv1d.weight", conv, d_conv, scale=0.5)
        m.f32(p + "ssm_conv1d.bias", conv, scale=0.1)
        m.f32(p + "ssm_dt.bias", dt_rank, scale=0.5)
        w.add_tensor(p + "ssm_a", -np.exp(0.5 * m.rng.standard_normal((dt_rank, 1))).astype(np.float32))
        m.ones(p + "ssm_d", dt_rank, 1)
        m.ones(p + "ssm_norm.weight", n_group, d_inner // n_group)
        m.mat(p + "ssm_out.weight", n_embd, d_inner)
    m.close()
    return m.path


def qwen35() -> Path:
    n_embd, n_layer, n_head, n_head_kv, head, n_ff = 64, 4, 4, 2, 32, 64
    d_state, n_group, dt_rank, d_conv, interval = 16, 2, 4, 4, 4
    key_dim, value_dim = d_state * n_group, d_state * dt_rank
    conv = 2 * key_dim + value_dim
    m = Writer("tiny-qwen35.gguf", "qwen35", 35)
    w, a = m.w, "qwen35"
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head)
    w.add_value_length(head)
    w.add_rope_dimension_count(16)
    w.add_array(f"{a}.rope.dimension_sections", [2, 3, 3, 0])
    w.add_rope_freq_base(1e6)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(value_dim)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    w.add_ssm_group_count(n_group)
    w.add_uint32(f"{a}.full_attention_interval", interval)
    m.embeddings(n_embd)
    m.ones("output_norm.weight", n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        m.ones(p + "attn_norm.weight", n_embd)
        m.ones(p + "post_attention_norm.weight", n_embd)
        if (i + 1) % interval == 0:
            m.mat(p + "attn_q.weight", n_head * head * 2, n_embd)  # queries and their gate
            m.mat(p + "attn_k.weight", n_head_kv * head, n_embd)
            m.mat(p + "attn_v.weight", n_head_kv * head, n_embd)
            m.mat(p + "attn_output.weight", n_embd, n_head * head)
            m.ones(p + "attn_q_norm.weight", head)
            m.ones(p + "attn_k_norm.weight", head)
        else:
            m.mat(p + "attn_qkv.weight", conv, n_embd)
            m.mat(p + "attn_gate.weight", value_dim, n_embd)
            m.f32(p + "ssm_conv1d.weight", conv, d_conv, scale=0.5)
            m.f32(p + "ssm_dt.bias", dt_rank, scale=0.5)
            w.add_tensor(p + "ssm_a", -np.exp(0.5 * m.rng.standard_normal(dt_rank)).astype(np.float32))
            m.mat(p + "ssm_beta.weight", dt_rank, n_embd)
            m.mat(p + "ssm_alpha.weight", dt_rank, n_embd)
            m.ones(p + "ssm_norm.weight", d_state)
            m.mat(p + "ssm_out.weight", n_embd, value_dim)
        m.ffn(p, n_embd, n_ff)
    m.close()
    return m.path


LFM2_KV_HEADS = [0, 0, 2, 0, 2]  # per layer: 0 = a short-convolution layer


def lfm2(window: int = 0) -> Path:
    n_embd, n_head, head, n_ff, l_cache = 64, 2, 32, 64, 3
    name = "tiny-lfm2-swa.gguf" if window else "tiny-lfm2.gguf"
    m = Writer(name, "lfm2", 1200 + window)
    w, a = m.w, "lfm2"
    w.add_embedding_length(n_embd)
    w.add_block_count(len(LFM2_KV_HEADS))
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(LFM2_KV_HEADS)
    w.add_uint32(f"{a}.shortconv.l_cache", l_cache)
    w.add_rope_freq_base(1e6)
    if window:
        w.add_sliding_window(window)
    m.embeddings(n_embd)
    m.ones("token_embd_norm.weight", n_embd)  # llama.cpp's name for LFM2's output norm
    for i, kv in enumerate(LFM2_KV_HEADS):
        p = f"blk.{i}."
        m.ones(p + "ffn_norm.weight", n_embd)
        m.ones(p + "attn_norm.weight", n_embd)
        m.ffn(p, n_embd, n_ff)
        if kv:
            m.ones(p + "attn_q_norm.weight", head)
            m.ones(p + "attn_k_norm.weight", head)
            m.mat(p + "attn_q.weight", n_embd, n_embd)
            m.mat(p + "attn_k.weight", kv * head, n_embd)
            m.mat(p + "attn_v.weight", kv * head, n_embd)
            m.mat(p + "attn_output.weight", n_embd, n_embd)
        else:
            m.f32(p + "shortconv.conv.weight", n_embd, l_cache, scale=0.5)
            m.mat(p + "shortconv.in_proj.weight", 3 * n_embd, n_embd)
            m.mat(p + "shortconv.out_proj.weight", n_embd, n_embd)
    m.close()
    return m.path


def write_states(model: Path, memory: str, folder: str, ctk: str, ctv: str, fa: bool, two: bool) -> None:
    """Decode PROMPT as sequence 0 (and PROMPT_1 as sequence 1 when `two`), in one batch, then save
    every container: seq-N.bin, seq-N.ggsq per sequence, state.bin and state.ggsn."""
    from kvfast.probe import Runner

    out = HERE / folder
    out.mkdir(exist_ok=True)
    if os.environ.get("LLAMA_ATTN_ROT_DISABLE"):
        sys.exit("LLAMA_ATTN_ROT_DISABLE is set: the fixtures must be written as llama.cpp does by default")
    seqs = [PROMPT, PROMPT_1] if two else [PROMPT]
    r = Runner(
        str(model), ctk=ctk, ctv=ctv, fa=fa, parallel=len(seqs), n_ctx=N_CTX, gpu_layers=0, unified=True
    )
    try:
        r.decode([(t, i, s, i == len(p) - 1) for s, p in enumerate(seqs) for i, t in enumerate(p)])
        L, ctx = r.L, r.ctx
        for s, p in enumerate(seqs):
            n = L.llama_state_seq_get_size(ctx, s)
            buf = (ctypes.c_uint8 * n)()
            got = L.llama_state_seq_get_data(ctx, buf, n, s)
            (out / f"seq-{s}.bin").write_bytes(bytes(buf[:got]))
            r.save_seq(out / f"seq-{s}.ggsq", s, p)
        r.save_whole(out / "state.bin")
        every = [t for p in seqs for t in p]
        toks = (L.llama_token * len(every))(*every)
        if not L.llama_state_save_file(ctx, os.fsencode(out / "state.ggsn"), toks, len(every)):
            raise RuntimeError("llama_state_save_file failed")
    finally:
        r.close()
    files = {f.name: f.stat().st_size for f in sorted(out.iterdir()) if f.name != "probe.json"}
    probe = {
        "model": model.name,
        "memory": memory,
        "ctk": ctk,
        "ctv": ctv,
        "fa": "on" if fa else "off",
        "n_ctx": N_CTX,
        "unified": True,
        "seqs": seqs,
        "files": files,
    }
    (out / "probe.json").write_text(json.dumps(probe, indent=1) + "\n")
    print(out.name, files)


# model -> (writer, llama.cpp's memory, [(folder, K type, V type, flash attention, two sequences)])
RUNS: dict[str, tuple[Callable[[], Path], str, list[tuple[str, str, str, bool, bool]]]] = {
    "deepseek2": (
        deepseek2_mla,
        "kv (V-less MLA)",
        [
            ("deepseek2mla-f16-fa", "f16", "f16", True, False),
            ("deepseek2mla-q8_0-fa", "q8_0", "q8_0", True, False),
            ("deepseek2mla-f16-nofa", "f16", "f16", False, False),
        ],
    ),
    "mamba2": (
        mamba2,
        "recurrent",
        [("mamba2tiny-f32", "f16", "f16", True, False), ("mamba2tiny-2seq", "f16", "f16", True, True)],
    ),
    "qwen35": (
        qwen35,
        "hybrid",
        [
            ("qwen35tiny-f16-fa", "f16", "f16", True, False),
            ("qwen35tiny-q8_0-fa", "q8_0", "q8_0", True, False),
            ("qwen35tiny-f16-nofa", "f16", "f16", False, False),
            ("qwen35tiny-2seq", "f16", "f16", True, True),
        ],
    ),
    "lfm2": (
        lfm2,
        "hybrid",
        [("lfm2tiny-f16-fa", "f16", "f16", True, False), ("lfm2tiny-q8_0-fa", "q8_0", "q8_0", True, False)],
    ),
    "lfm2-swa": (lambda: lfm2(window=4), "hybrid iswa", [("lfm2swatiny-f16-fa", "f16", "f16", True, False)]),
}


if __name__ == "__main__":
    for key in sys.argv[1:] or list(RUNS):
        make, memory, runs = RUNS[key]
        path = make()
        print(path.name, path.stat().st_size, "bytes")
        for folder, ctk, ctv, fa, two in runs:
            write_states(path, memory, folder, ctk, ctv, fa, two)
