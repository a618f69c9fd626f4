import json
import subprocess
import sys

from conftest import DATA

from kvfast.cli import main


def test_info_on_the_bundled_sample(capsys) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "ggsq version 3" in out
    assert "148,156 = rows 147,456 + outputs 0 + metadata 700" in out
    assert "cache 1 at byte 24,804" in out


def test_info_json_and_python_m() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "kvfast", "info", "--json", str(DATA / "qwen3tiny-3seq-shared/state.bin")],
        capture_output=True,
        text=True,
        check=True,
    )
    d = json.loads(r.stdout)
    assert d["container"] == "state" and d["arch"] == "qwen3"
    [s] = d["caches"][0]["streams"]
    assert (s["cells"], s["shared_cells"], s["sequences"]) == (28, 4, [0, 1, 2])
    assert d["row_bytes"] + d["meta_bytes"] == d["size"] == 14777


def test_info_error_is_one_line(capsys) -> None:
    assert main(["info", str(DATA / "models/tiny-qwen3.gguf")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "byte 0" in err and "Traceback" not in err
