"""Keys before RoPE against llama.cpp run here (llama-cpp-python): tiny models written for the test,
NORM (llama) and NEOX (qwen3) pairing, linear and YaRN scaling. Layer 0's K of a token depends on
the token alone before RoPE: one token at two positions (in two sequences) must give one key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

import kvfast

gguf = pytest.importorskip("gguf")
pytest.importorskip("llama_cpp")

N_EMBD, N_HEAD, N_HEAD_KV, HEAD, N_FF, N_VOCAB = 64, 4, 2, 32, 64, 64
T = 17  # the token seen at two positions


def write_model(path: Path, arch: str, rope: dict[str, Any]) -> None:
    rng = np.random.default_rng(7)

    def mat(rows: int, cols: int) -> Any:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_vocab_size(N_VOCAB)
    w.add_context_length(256)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(1)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD)
    w.add_value_length(HEAD)
    w.add_rope_dimension_count(HEAD)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("none")
    if "type" in rope:
        w.add_rope_scaling_type(rope["type"])
        w.add_rope_scaling_factor(rope["factor"])
    if "orig" in rope:
        w.add_rope_scaling_orig_ctx_len(rope["orig"])
    w.add_tensor("token_embd.weight", rng.standard_normal((N_VOCAB, N_EMBD)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    w.add_tensor("output.weight", mat(N_VOCAB, N_EMBD))
    for name, t in {
        "attn_norm": np.ones(N_EMBD, np.float32),
        "attn_q": mat(N_HEAD * HEAD, N_EMBD),
        "attn_k": mat(N_HEAD_KV * HEAD, N_EMBD),
        "attn_v": mat(N_HEAD_KV * HEAD, N_EMBD),
        "attn_output": mat(N_EMBD, N_HEAD * HEAD),
        "ffn_norm": np.ones(N_EMBD, np.float32),
        "ffn_gate": mat(N_FF, N_EMBD),
        "ffn_up": mat(N_FF, N_EMBD),
        "ffn_down": mat(N_EMBD, N_FF),
    }.items():
        w.add_tensor(f"blk.0.{name}.weight", t)
    if arch == "qwen3":
        w.add_tensor("blk.0.attn_q_norm.weight", np.ones(HEAD, np.float32))
        w.add_tensor("blk.0.attn_k_norm.weight", np.ones(HEAD, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


CASES = {
    "llama-norm": ("llama", {}),
    "llama-norm-linear": ("llama", {"type": gguf.RopeScalingType.LINEAR, "factor": 4.0}),
    "qwen3-neox": ("qwen3", {}),
    "qwen3-neox-yarn": ("qwen3", {"type": gguf.RopeScalingType.YARN, "factor": 4.0, "orig": 64}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_llama_cpp_keys_of_one_token_at_two_positions(case: str, tmp_path: Path) -> None:
    from kvfast.probe import Runner

    arch, rope = CASES[case]
    model = tmp_path / f"{case}.gguf"
    write_model(model, arch, rope)
    r = Runner(str(model), ctk="f16", ctv="f16", fa=True, parallel=2, n_ctx=64, gpu_layers=0, unified=True)
    try:
        # T at position 1 of sequence 0 and position 40 of sequence 1
        seq1 = [(t % N_VOCAB, i, 1, False) for i, t in enumerate(range(3, 43))]
        r.decode([(5, 0, 0, False), (T, 1, 0, True), *seq1, (T, 40, 1, True)])
        r.save_whole(tmp_path / "state.bin")
    finally:
        r.close()

    def keys(pre: bool, gguf_path: Path = model) -> tuple[Any, Any]:
        d = kvfast.open(tmp_path / "state.bin", model=gguf_path, pre_rope=pre)
        t = d.to_polars(kinds="k")
        one = [
            np.array(t.filter(pl.col("seq_id") == q, pl.col("pos") == p)["values"].to_list(), np.float32)
            for q, p in ((0, 1), (1, 40))
        ]
        return one[0], one[1]

    a, b = keys(False)
    assert np.abs(a - b).max() > 0.1
    a, b = keys(True)
    scale = float(np.abs(a).max())
    assert np.abs(a - b).max() < 2e-3 * max(scale, 1.0), (case, np.abs(a - b).max(), scale)
    if rope:
        # the scaling matters: undone without it, the keys do not agree
        plain = tmp_path / "plain.gguf"
        write_model(plain, arch, {})
        a, b = keys(True, plain)
        assert np.abs(a - b).max() > 0.05


DATA = Path(__file__).parent / "data" / "models"


@pytest.mark.parametrize("name", ["tiny-qwen2vl.gguf", "tiny-qwen35.gguf"])
def test_m_rope_text_cells_against_llama_cpp(name: str, tmp_path: Path) -> None:
    """M-RoPE (Qwen2-VL: sections in a row; Qwen3.5: interleaved, after recurrent layers): the
    same input before the attention layer at two positions (M-RoPE lets positions jump) gives one
    key before RoPE."""
    from kvfast.probe import Runner

    model = DATA / name
    r = Runner(str(model), ctk="f16", ctv="f16", fa=True, parallel=2, n_ctx=64, gpu_layers=0, unified=True)
    try:
        r.decode([(5, 0, 0, False), (9, 1, 0, False), (T, 2, 0, True)])
        r.decode([(5, 0, 1, False), (9, 1, 1, False), (T, 40, 1, True)])
        r.save_whole(tmp_path / "state.bin")
    finally:
        r.close()

    def keys(pre: bool) -> tuple[Any, Any]:
        t = kvfast.open(tmp_path / "state.bin", model=model, pre_rope=pre).to_polars(kinds="k", layers=[0])
        a, b = (
            np.array(t.filter(pl.col("seq_id") == q, pl.col("pos") == p)["values"].to_list(), np.float32)
            for q, p in ((0, 2), (1, 40))
        )
        return a, b

    a, b = keys(False)
    assert np.abs(a - b).max() > 0.05
    a, b = keys(True)
    assert np.abs(a - b).max() < 2e-3 * max(1.0, float(np.abs(a).max())), np.abs(a - b).max()
