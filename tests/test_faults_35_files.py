"""Issue 35, states and folders: keep= where it cannot mean what it asks (a PARTIAL_ONLY checkpoint of
an iSWA model, a state with no attention cell) is refused; a state opened with another model's GGUF is
refused (its arch, or M-RoPE cells with a model without M-RoPE), never read as that model's partial
state; the writer writes no arch name the reader refuses; a glob over a folder tree with symbolic
links to a parent ends, and a folder that cannot be listed is an error, not states left out."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA

import kvfast
from kvfast.dataset import expand
from kvfast.errors import ModelMismatchError, WriteError
from kvfast.writing.cells import cells

MODELS = DATA / "models"


def test_keep_on_a_partial_checkpoint_of_an_iswa_model_is_refused(tmp_path: Path) -> None:
    with kvfast.open(DATA / "gemma3tiny-partial/seq-0.partial.bin", model=MODELS / "tiny-gemma3.gguf") as d:
        keep = np.ones(cells(d).height, bool)
        keep[1] = False
        with pytest.raises(
            WriteError, match=r"partial state .* full-attention cache of model layers \[1, 3\]"
        ):
            kvfast.write(d, tmp_path / "x.bin", keep=keep)
        assert not (tmp_path / "x.bin").exists()
        kvfast.write(d, tmp_path / "x.bin", keep=np.ones(len(keep), bool))  # dropping nothing is the state
        assert (tmp_path / "x.bin").read_bytes() == Path(d.path).read_bytes()


@pytest.mark.parametrize(
    ("state", "model", "memory"),
    [
        ("lfm2tiny-partial/seq-0.partial.bin", "tiny-lfm2.gguf", "a recurrent part"),  # a hybrid's checkpoint
        ("mamba2tiny-f32/seq-0.bin", "tiny-mamba2.gguf", "a recurrent part"),
        ("gemma3tiny-partial/seq-1.bin", "tiny-gemma3.gguf", "empty caches"),  # an empty sequence
    ],
)
def test_keep_on_a_state_with_no_attention_cell_is_refused(
    state: str, model: str, memory: str, tmp_path: Path
) -> None:
    said = f"holds no cell of an attention cache \\(its memory: {memory}\\)"
    with kvfast.open(DATA / state, model=MODELS / model) as d, pytest.raises(WriteError, match=said):
        kvfast.write(d, tmp_path / "x.bin", keep=np.ones(0, bool))


@pytest.mark.parametrize("name", ["state.bin", "state.ggsn", "seq-0.ggsq", "seq-0.bin"])
def test_a_state_opened_with_another_models_gguf_is_refused(name: str) -> None:
    path = DATA / "qwen2vltiny-f16-fa" / name
    with pytest.raises(ModelMismatchError, match="qwen2vl model, the model given is a gemma3|M-RoPE") as e:
        kvfast.open(path, model=MODELS / "tiny-gemma3.gguf")
    assert e.value.field == "general.architecture"
    with kvfast.open(path, model=MODELS / "tiny-qwen2vl.gguf") as d:
        assert d.partial is None


def test_a_whole_state_of_another_arch_is_refused_even_where_the_layers_fit() -> None:
    # the tiny qwen3 and the hd128 one are both qwen3: the same arch, other geometry
    with pytest.raises(ModelMismatchError, match="KV heads"):
        kvfast.open(DATA / "qwen3tiny-f16-fa/state.bin", model=MODELS / "tiny-qwen3-hd128.gguf")
    with pytest.raises(ModelMismatchError, match="written by a qwen3 model, the model given is a qwen2vl"):
        kvfast.open(DATA / "qwen3tiny-f16-fa/state.bin", model=MODELS / "tiny-qwen2vl.gguf")


@pytest.mark.parametrize("arch", ["qw\0en3", "x" * 65, "qwen 3", "é"])
def test_the_writer_writes_no_arch_name_the_reader_refuses(arch: str, tmp_path: Path) -> None:
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.ggsq") as d:
        with pytest.raises(WriteError, match="arch: an architecture name of 1 to 64 characters") as e:
            kvfast.write(d, tmp_path / "x.bin", container="state", arch=arch)
        assert e.value.field == "arch"
        assert not (tmp_path / "x.bin").exists()
        kvfast.write(d, tmp_path / "x.bin", container="state", arch="x" * 64)
        with kvfast.open(tmp_path / "x.bin") as e2:
            assert e2.arch == "x" * 64


def tree(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    (root / "a" / "b").mkdir(parents=True)
    src = DATA / "qwen3tiny-f16-fa/seq-0.ggsq"
    for p in ("x.ggsq", "a/y.ggsq", "a/b/z.ggsq"):
        shutil.copy(src, root / p)
    return root


def test_a_glob_ends_over_symbolic_links_to_a_parent(tmp_path: Path) -> None:
    root = tree(tmp_path)
    os.symlink("..", root / "a" / "up1")
    os.symlink("..", root / "a" / "up2")
    want = [str(root / p) for p in ("a/b/z.ggsq", "a/y.ggsq", "x.ggsq")]
    assert expand(str(root / "**" / "*.ggsq")) == want
    assert expand(str(root / "*" / "*.ggsq")) == [str(root / "a/y.ggsq")]
    assert sorted(expand(str(root))) == want  # the folder given as such: the same states


def unreadable(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """`folder` cannot be listed (as without permission: the tests may run as root)."""
    real: Callable[..., object] = os.scandir

    def scandir(path: object = ".") -> object:
        if os.fspath(path) == str(folder):  # type: ignore[arg-type]
            raise PermissionError(errno.EACCES, "Permission denied", str(folder))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


@pytest.mark.parametrize("how", ["folder", "glob", "glob one level"])
def test_a_folder_that_cannot_be_listed_is_an_error_not_skipped(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tree(tmp_path)
    unreadable(monkeypatch, root / "a")
    given = {
        "folder": str(root),
        "glob": str(root / "**" / "*.ggsq"),
        "glob one level": str(root / "*" / "*"),
    }
    with pytest.raises(PermissionError) as e:
        expand(given[how])
    assert e.value.filename == str(root / "a")


def test_export_of_a_folder_that_cannot_be_listed_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvfast.cli import main

    root = tree(tmp_path)
    unreadable(monkeypatch, root / "a")
    assert main(["export", str(root / "**" / "*.ggsq"), "-o", str(tmp_path / "out")]) == 1
