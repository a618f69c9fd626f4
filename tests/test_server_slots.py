"""llama-server slot files (packed token blob), mid-2026 session files, and token text."""

import json
import shutil
import struct
import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import model_with_vocab
from quants import hadamard

import kvfast
from kvfast.cli import main

DATA = Path(__file__).parent / "data"
SERVER = DATA / "gemma3-270m-server"
PROBE = json.loads((SERVER / "probe.json").read_text())
SLOTS = sorted(PROBE["files"])


@pytest.mark.parametrize("name", SLOTS)
def test_slot_tokens_are_the_real_tokens(name: str) -> None:
    want = PROBE["files"][name]
    with kvfast.open(SERVER / name) as d:
        assert d.tokens is not None
        assert d.tokens.tolist() == want["tokens"]
        words = d.token_words
        assert words is not None and len(words) == want["token_words"]
        assert words[0] == -1 and words[1] == 1 and words[2] == len(want["tokens"])
        assert d.server_tokens == {"version": 1, "n_tokens": len(want["tokens"]), "media": []}
        assert "server token blob v1" in d.features
        # every cell of the slot's sequence holds its token
        toks = d.cell_tokens()
        assert toks["token"].to_list()[: len(want["tokens"])] == want["tokens"]


def test_info_says_what_it_found(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(SERVER / SLOTS[0])]) == 0
    out = capsys.readouterr().out
    assert "n_tokens   20" in out
    assert "llama-server packed blob version 1: 20 tokens, 0 media chunk(s)" in out


def _with_words(src: Path, dst: Path, words: list[int]) -> None:
    """A copy of a GGSQ file with another token array (the memory bytes kept)."""
    raw = src.read_bytes()
    n = struct.unpack_from("<I", raw, 8)[0]
    dst.write_bytes(raw[:8] + struct.pack(f"<I{len(words)}i", len(words), *words) + raw[12 + 4 * n :])


def _blob(tokens: list[int], media: list[tuple[int, bytes]], version: int = 1) -> list[int]:
    b = struct.pack("<iII", -1, version, len(tokens)) + struct.pack(f"<{len(tokens)}i", *tokens)
    b += struct.pack(f"<I{len(media)}I", len(media), *[m[0] for m in media])
    for _, chunk in media:
        b += struct.pack("<I", len(chunk)) + chunk
    b += b"\0" * (-len(b) % 4)
    return list(struct.unpack(f"<{len(b) // 4}i", b))


def test_media_chunks_are_located(tmp_path: Path) -> None:
    src = SERVER / SLOTS[0]
    tokens = PROBE["files"][SLOTS[0]]["tokens"]
    chunk = b"image bytes!!"
    p = tmp_path / "media.bin"
    _with_words(src, p, _blob(tokens, [(3, chunk)]))
    with kvfast.open(p) as d:
        assert d.tokens is not None and d.tokens.tolist() == tokens
        st = d.server_tokens
        assert st is not None and len(st["media"]) == 1
        m = st["media"][0]
        assert m["start"] == 3 and m["nbytes"] == len(chunk)
        assert p.read_bytes()[m["offset"] : m["offset"] + m["nbytes"]] == chunk


def test_unknown_blob_version_and_bad_blobs_are_errors(tmp_path: Path) -> None:
    src = SERVER / SLOTS[0]
    tokens = PROBE["files"][SLOTS[0]]["tokens"]
    p = tmp_path / "v2.bin"
    _with_words(src, p, _blob(tokens, [], version=2))
    with pytest.raises(kvfast.UnsupportedVersionError) as e:
        kvfast.open(p)
    assert e.value.offset == 16 and "token blob" in str(e.value)
    # a count past the array
    words = _blob(tokens, [])
    words[2] = 10_000
    _with_words(src, p, words)
    with pytest.raises(kvfast.TruncatedError):
        kvfast.open(p)
    # a media start past the tokens
    _with_words(src, p, _blob(tokens, [(99, b"x")]))
    with pytest.raises(kvfast.FormatError, match="media 0 start"):
        kvfast.open(p)


def test_plain_token_lists_stay_plain() -> None:
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.ggsq") as d:
        assert d.server_tokens is None
        assert d.tokens is not None and d.token_words is not None
        assert d.tokens.tolist() == d.token_words.tolist()


@pytest.mark.parametrize("folder", ["qwen3tiny-f16-fa-2026mid", "gemma3-270m-f16-fa-2026mid"])
def test_mid_2026_session_files_have_no_outputs(folder: str) -> None:
    with kvfast.open(DATA / folder / "state.ggsn") as d, kvfast.open(DATA / folder / "seq-0.bin") as s:
        assert (d.container, d.version) == ("ggsn", 9)
        assert "outputs" not in d.features and d.logits is None and d.output_bytes == 0
        for c in d.caches:
            for layer in range(c.n_layer):
                for kind in "kv":
                    np.testing.assert_array_equal(
                        d.values(layer, kind, cache=c.index), s.values(layer, kind, cache=c.index)
                    )
    with kvfast.open(DATA / "qwen3tiny-f16-fa-2025/state.ggsn") as old:
        assert (old.version, "outputs" in old.features) == (9, True)


def test_quant_error_simulates_llama_cpps_rotation() -> None:
    """quant_error of q8_0 equals NumPy's pipeline: rotate, quantize (gguf's reference), dequantize, undo."""
    with kvfast.open(SERVER / "gemma3-270m-server-f16-slot0.bin", head_dim=256) as d:
        for kind, group in (("k", 256), ("v", 64)):
            x = d.values(2, kind, cache=1, dtype="float32")
            q8 = gguf.GGMLQuantizationType.Q8_0
            rot = hadamard(x, group).astype(np.float32)
            back = hadamard(gguf.quants.dequantize(gguf.quants.quantize(rot, q8), q8), group)
            want = np.sqrt(((back - x) ** 2).sum() / (x.astype(np.float64) ** 2).sum())
            plain = gguf.quants.dequantize(gguf.quants.quantize(x, q8), q8)
            want_plain = np.sqrt(((plain - x) ** 2).sum() / (x.astype(np.float64) ** 2).sum())
            got = d.quant_error("q8_0", by="layer", layers=[2], kinds=kind).filter(cache=1)
            got_plain = d.quant_error("q8_0", by="layer", layers=[2], kinds=kind, rotate=False).filter(
                cache=1
            )
            assert got["rotation"].item() == group and got_plain["rotation"].item() == 0
            assert got["rel"].item() == pytest.approx(want, rel=1e-4)
            assert got_plain["rel"].item() == pytest.approx(want_plain, rel=1e-4)
            assert want < want_plain  # what the rotation buys


def test_quant_error_without_a_head_size_warns_and_does_not_rotate() -> None:
    with kvfast.open(SERVER / "gemma3-270m-server-f16-slot0.bin") as d:
        with pytest.warns(kvfast.RotationWarning, match="head size is unknown"):
            df = d.quant_error("q8_0", by="layer", layers=[0])
        assert set(df["rotation"].to_list()) == {0}
    # a rotated state tells the group itself
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kvfast.RotationWarning)  # K's group is a guess, said once
        d = kvfast.open(SERVER / "gemma3-270m-server-q8_0-slot0.bin")
        d.values(0, "k")
    with warnings.catch_warnings(), d:
        warnings.simplefilter("error", kvfast.RotationWarning)
        df = d.quant_error("q4_0", by="layer", layers=[0])
        assert dict(zip(df["kind"], df["rotation"], strict=True)) == {"k": 256, "v": 64}


def test_show_prints_stored_numbers_and_the_model_basis(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(SERVER / "gemma3-270m-server-q8_0-slot0.bin")
    assert main(["show", path, "--layer", "0", "--cells", "1", "--head-dim", "256"]) == 0
    out = capsys.readouterr().out
    assert "token 2" in out and "rotation undone in groups of 256" in out
    assert main(["show", path, "--layer", "0", "--cells", "1", "--rotation", "none"]) == 0
    assert "rotation undone" not in capsys.readouterr().out


@pytest.mark.parametrize("tokenizer", ["llama", "gpt2"])
def test_token_pieces_from_the_models_vocabulary(tmp_path: Path, tokenizer: str) -> None:
    # more entries than the metadata reader keeps of other arrays, so the vocabulary path is taken
    pieces = [f"tok{i}" for i in range(70_000)]
    pieces[68] = "\u2581cat" if tokenizer == "llama" else "\u0120cat"
    pieces[32] = "<0x41>"
    model = tmp_path / "vocab.gguf"
    model_with_vocab(model, pieces, tokenizer)
    seq = json.loads((DATA / "qwen3tiny-f16-fa/probe.json").read_text())["seqs"][0]
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.ggsq", model=model) as d:
        toks = d.cell_tokens()
        assert toks["token"].to_list() == seq
        got = dict(zip(toks["token"], toks["piece"], strict=True))
        assert got[68] == " cat"
        assert got[32] == "A"
        assert got[seq[2]] == f"tok{seq[2]}"
        stats = d.stats(tokens=True, kinds="k", layers=[0])
        assert stats.filter(head=0)["piece"].to_list() == [got[t] for t in seq]
        df = d.to_polars(tokens=True, kinds=["k"], layers=[1])
        assert df.filter(head=1)["token"].to_list() == seq
    # a whole state of several sequences cannot map positions to one token list
    with kvfast.open(DATA / "qwen3tiny-3seq-shared/state.ggsn") as d:
        assert d.cell_tokens()["token"].null_count() == d.cell_tokens().height


def test_heatmap_labels_cells_with_pieces(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from kvfast import plot

    pieces = [f"w{i}" for i in range(300)]
    model = tmp_path / "vocab.gguf"
    model_with_vocab(model, pieces, "llama")
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.ggsq", model=model) as d:
        fig = plot.heatmap(d, 0)
        labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        seq = d.tokens
        assert seq is not None
        assert labels[0] == f"0 'w{seq[0]}'"


def test_copied_fixture_is_untouched(tmp_path: Path) -> None:
    # the slot tests above build on copies; the originals stay as llama-server wrote them
    p = tmp_path / "copy.bin"
    shutil.copy(SERVER / SLOTS[0], p)
    assert p.stat().st_size == PROBE["files"][SLOTS[0]]["bytes"]
