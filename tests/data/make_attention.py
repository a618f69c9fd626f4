"""Make tiny-gemma3-attn.gguf, the iSWA model of the attention tests.

    cd tests/data && ../../.venv/bin/python make_attention.py

gemma3, 3 layers (sliding_window_pattern 3: layers 0 and 1 slide through a window of 4 positions,
layer 2 attends to everything, so a state holds two caches), 4 query heads, 2 KV heads of 64 values
(a quantized cache is Hadamard-rotated in groups of 64), embedding 64, vocabulary 256, no tokenizer,
random weights (seeded), written with the `gguf` package with the tensors llama.cpp's loader asks for
(src/models/gemma3.cpp in llama-cpp-python 0.3.36's llama.cpp). Gemma 3 scales its queries by
1 / sqrt(64) in its graph and passes a softmax scale of 1; its sliding layers use
rope.freq_base_swa (10000) and the others rope.freq_base (1e6).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

HERE = Path(__file__).resolve().parent
MODEL = HERE / "models" / "tiny-gemma3-attn.gguf"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD, N_FF, N_VOCAB, WINDOW = 64, 3, 4, 2, 64, 64, 256, 4


def write_model(path: Path = MODEL) -> None:
    rng = np.random.default_rng(270)

    def mat(rows: int, cols: int) -> np.ndarray:  # GGUF shape [cols, rows]: y = W x, x of size cols
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, np.float32)

    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_name("tiny-gemma3-l3-swa4")
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
    w.add_sliding_window(WINDOW)
    w.add_uint32("gemma3.attention.sliding_window_pattern", 3)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("none")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tensor("token_embd.weight", rng.standard_normal((N_VOCAB, N_EMBD)).astype(np.float32) / 8)
    w.add_tensor("output_norm.weight", ones(N_EMBD))
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(N_EMBD))
        w.add_tensor(p + "attn_q.weight", mat(N_HEAD * HEAD, N_EMBD))
        w.add_tensor(p + "attn_k.weight", mat(N_HEAD_KV * HEAD, N_EMBD))
        w.add_tensor(p + "attn_v.weight", mat(N_HEAD_KV * HEAD, N_EMBD))
        w.add_tensor(p + "attn_output.weight", mat(N_EMBD, N_HEAD * HEAD))
        w.add_tensor(p + "post_attention_norm.weight", ones(N_EMBD))
        # Gemma's norms weigh by (1 + w) in HF; llama.cpp's GGUF stores 1 + w: a spread of gains
        w.add_tensor(p + "attn_q_norm.weight", (1 + rng.random(HEAD)).astype(np.float32))
        w.add_tensor(p + "attn_k_norm.weight", (1 + 2 * rng.random(HEAD)).astype(np.float32))
        w.add_tensor(p + "ffn_norm.weight", ones(N_EMBD))
        w.add_tensor(p + "ffn_gate.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_down.weight", mat(N_EMBD, N_FF))
        w.add_tensor(p + "post_ffw_norm.weight", ones(N_EMBD))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    write_model()
    print(MODEL.name, MODEL.stat().st_size, "bytes")
