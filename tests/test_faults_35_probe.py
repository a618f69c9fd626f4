"""Issue 35, the probe runner: prompts are taken as given or refused (token ids beyond int32 never
wrap, 6.7 / "5" / True are no token ids, a JSONL line that is not an object, a hidden prompt id, a
token outside the vocabulary), the numeric options are checked before llama.cpp allocates anything,
a prompts file that is a FIFO is refused at once, and one run at a time writes into a folder."""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import pytest
from conftest import DATA

from kvfast.cli import main
from kvfast.errors import OutputError, ProbeError

if not os.environ.get("KVFAST_REQUIRE_PROBE"):
    pytest.importorskip("llama_cpp")
from kvfast import probe
from kvfast.probe import checks
from kvfast.probe.runner import load_prompts

MODEL = str(DATA / "models/tiny-qwen3.gguf")
PROMPTS = [{"id": "a", "tokens": [253, 230, 241]}, {"id": "b", "tokens": [48, 249, 14, 199]}]


@pytest.mark.parametrize("bad", [2**32 + 5, 2**31, -1, 6.7, "5", True, None])
def test_a_token_id_is_a_whole_number_of_int32_or_refused(bad: object) -> None:
    with pytest.raises(ProbeError, match=r"prompt 'a': tokens\[1\] is .*expected a token id"):
        load_prompts([{"id": "a", "tokens": [5, bad, 7]}])
    assert load_prompts([{"id": "a", "tokens": [5, 2**31 - 1, 7]}])[0].tokens == [5, 2**31 - 1, 7]


def test_tokens_that_are_no_list_are_refused() -> None:
    with pytest.raises(ProbeError, match="expected a list of token ids, found str"):
        load_prompts([{"id": "a", "tokens": "5 6 7"}])


def test_a_jsonl_line_that_is_no_object_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text('{"id": "a", "tokens": [1, 2]}\n[1, 2, 3]\n')
    with pytest.raises(
        ProbeError, match=r"prompt 2: expected a string or an object .* found list \[1, 2, 3\]"
    ):
        load_prompts(p)


@pytest.mark.parametrize("pid", [".h", "..x", "a/b", "a\0b"])
def test_a_prompt_id_naming_a_hidden_or_other_file_is_refused(pid: str) -> None:
    with pytest.raises(ProbeError, match="prompt id"):
        load_prompts([{"id": pid, "tokens": [1, 2]}])


def test_a_prompts_file_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    f = tmp_path / "prompts.jsonl"
    os.mkfifo(f)
    t = threading.Thread(target=lambda: open(f, "wb").close(), daemon=True)  # an old reader: EOF, no hang
    t.start()
    try:
        with pytest.raises(OSError, match="a FIFO, not a regular file") as e:
            load_prompts(f)
        assert e.value.errno == errno.EINVAL
    finally:
        fd = os.open(f, os.O_RDONLY | os.O_NONBLOCK)
        t.join()
        os.close(fd)


def test_a_token_outside_the_vocabulary_is_named(tmp_path: Path) -> None:
    with pytest.raises(ProbeError, match=r"prompt 'b': token id 1000000 is not in the model's vocabulary"):
        probe.run(
            MODEL, [PROMPTS[0], {"id": "b", "tokens": [1, 10**6]}], tmp_path / "o", n_ctx=64, progress=False
        )
    assert not (tmp_path / "o" / "a.ggsq").exists()  # refused before any decode


@pytest.mark.parametrize(
    ("option", "value"),
    [("n_ctx", -1), ("n_ctx", 0), ("n_ctx", 10**9), ("n_ctx", 2**32), ("n_ctx", True), ("n_ctx", 64.0),
     ("parallel", 0), ("parallel", 257), ("generate", -1), ("gpu_layers", -2), ("ctk", "q9_9")],
)  # fmt: skip
def test_options_out_of_range_are_refused_before_llama_cpp(
    option: str, value: object, tmp_path: Path
) -> None:
    kw: dict[str, object] = {"n_ctx": 64, option: value}
    with pytest.raises(ProbeError, match=option) as e:
        probe.run(MODEL, PROMPTS, tmp_path / "o", progress=False, **kw)  # type: ignore[arg-type]
    assert e.value.field == option


def test_ctx_minus_one_on_the_command_line_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in PROMPTS))
    with pytest.raises(SystemExit) as e:
        main(["probe", MODEL, str(prompts), "-o", str(tmp_path / "o"), "--ctx", "-1"])
    assert e.value.code == 2 and "-1 is not a positive integer" in capsys.readouterr().err


def test_a_second_run_into_a_busy_folder_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    with checks.holding(out):  # another run, alive
        with pytest.raises(OutputError, match="another kvfast probe is writing into this folder") as e:
            probe.run(MODEL, PROMPTS, out, n_ctx=64, progress=False)
        assert e.value.errno == errno.EBUSY
    assert not (out / probe.MANIFEST).exists()
    # the lock goes with its holder: the next run goes on, and a run resumed (its states kept) sweeps
    # what a killed run left
    assert probe.run(MODEL, PROMPTS, out, n_ctx=64, progress=False)["status"].to_list() == ["ok", "ok"]
    left = [out / ".a.queries.npy.tmp", out / ".a.queries.json.tmp", out / ".a.ggsq.999999-0.kvfast-tmp"]
    for f in left:
        f.write_bytes(b"partial")
    man = probe.run(MODEL, PROMPTS, out, n_ctx=64, progress=False)
    assert man["rerun"].to_list() == ["kept", "kept"] and not any(f.exists() for f in left)
