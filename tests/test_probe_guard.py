"""kvfast probe survives a crash of llama.cpp (issue 14): the run happens in a child process, and a
death by SIGILL (a llama-cpp-python compiled for another CPU) is reported with the rebuild command.

The crash is real: a stand-in ``llama_cpp`` package, first on the child's PYTHONPATH, kills its own
process with the signal when the probe imports it (as a llama.cpp built with instructions this CPU
lacks dies in its first call). No llama-cpp-python is needed.
"""

import json
import os
import signal
from pathlib import Path

import pytest
from conftest import DATA

from kvfast.cli import main
from kvfast.probe import guard as probe_guard

MODEL = str(DATA / "models/tiny-qwen3.gguf")


@pytest.fixture()
def prompts(tmp_path: Path) -> Path:
    p = tmp_path / "prompts.jsonl"
    p.write_text(json.dumps({"id": "x", "tokens": [5, 6, 7, 8]}) + "\n")
    return p


def _crashing_llama(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals) -> None:
    pkg = tmp_path / "fake" / "llama_cpp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"import os, signal\nos.kill(os.getpid(), signal.{sig.name})\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(pkg.parent), os.environ.get("PYTHONPATH", "")]))


def test_sigill_is_reported_with_the_rebuild_command(
    tmp_path: Path, prompts: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    _crashing_llama(tmp_path, monkeypatch, signal.SIGILL)
    with pytest.raises(probe_guard.ProbeCrashError) as e:
        probe_guard.run(MODEL, prompts, tmp_path / "out", progress=False)
    assert e.value.signal == signal.SIGILL
    assert "SIGILL" in str(e.value) and 'CMAKE_ARGS="-DGGML_NATIVE=OFF"' in str(e.value)
    assert "Fatal Python error" in capfd.readouterr().err  # faulthandler: where it died
    assert main(["probe", MODEL, str(prompts), "-o", str(tmp_path / "out")]) == 128 + signal.SIGILL
    err = capfd.readouterr().err
    assert "kvfast probe: error: llama.cpp died of SIGILL" in err and "--force-reinstall" in err


def test_other_crashes_are_reported_too(
    tmp_path: Path, prompts: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    _crashing_llama(tmp_path, monkeypatch, signal.SIGSEGV)
    assert main(["probe", MODEL, str(prompts), "-o", str(tmp_path / "out")]) == 128 + signal.SIGSEGV
    err = capfd.readouterr().err
    assert "llama.cpp died of SIGSEGV" in err and "resumes" in err and "GGML_NATIVE" not in err


def test_python_errors_come_back_as_themselves(tmp_path: Path, prompts: Path) -> None:
    with pytest.raises(FileNotFoundError) as e:
        probe_guard.run(tmp_path / "missing.gguf", prompts, tmp_path / "out", progress=False)
    assert e.value.filename is not None and "missing.gguf" in str(e.value.filename)
    with pytest.raises(ValueError):
        probe_guard.run(MODEL, [{"id": "x"}], tmp_path / "out", progress=False)  # no prompt nor tokens


def test_the_messages() -> None:
    assert probe_guard.REBUILD in probe_guard.crash_message(signal.SIGILL)
    assert "SIGBUS" in probe_guard.crash_message(signal.SIGBUS)
    assert "signal 200" in probe_guard.crash_message(200)
