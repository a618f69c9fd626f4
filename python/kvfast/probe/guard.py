"""The probe runner in a child process, so that a crash of llama.cpp is reported instead of killing
the caller (the shell command, or a notebook's kernel).

llama-cpp-python builds llama.cpp with ``-march=native`` unless told otherwise, and pip reuses a
wheel it built on one machine on any other that shares its cache: on an older CPU the first
``llama_decode`` then dies of SIGILL (an illegal instruction), with no Python error at all. Run in a
child, that death is a return code: :func:`run` raises :class:`ProbeCrashError` saying what
happened and, for SIGILL, how to rebuild llama-cpp-python for any CPU. The child also enables
:mod:`faulthandler`, so the Python stack of the crash (``llama_decode`` ...) is printed on stderr.
States saved before a crash are kept, and running the same probe again resumes.

A Python error in the child is raised again in the caller, as the same built-in or kvfast type where
there is one, else as a RuntimeError naming it.
"""

from __future__ import annotations

import builtins
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

import kvfast
from kvfast.errors import ProbeCrashError
from kvfast.probe.manifest import NAME as MANIFEST

REBUILD = 'CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install --force-reinstall --no-cache-dir llama-cpp-python'


def crash_message(signum: int) -> str:
    """What a death by `signum` during a probe means, and what to do."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    resume = "States saved before it are kept; the same command resumes the run."
    if signum == signal.SIGILL:
        return (
            "llama.cpp died of SIGILL (an illegal instruction) during the probe: the installed"
            " llama-cpp-python was compiled for another CPU (llama.cpp builds with -march=native by"
            " default, and pip reuses a wheel built on another machine). Rebuild it for any CPU:\n"
            f"    {REBUILD}\n" + resume
        )
    return (
        f"llama.cpp died of {name} during the probe (a crash in llama.cpp or llama-cpp-python; its"
        f" Python stack is printed above). {resume}"
    )


def _payload(model: Any, prompts: Any, out_dir: Any, options: dict[str, Any]) -> str:
    if isinstance(prompts, (str, os.PathLike)):
        prompts = os.fspath(prompts)
    else:
        prompts = list(prompts)
    return json.dumps(
        {"model": os.fspath(model), "prompts": prompts, "out_dir": os.fspath(out_dir), "options": options}
    )


def _raise_from(outcome: dict[str, Any]) -> None:
    """Raise the child's error in this process, as the same type where one is known."""
    name, message = outcome["error"], outcome["message"]
    cls = getattr(kvfast, name, None) or getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        if issubclass(cls, OSError) and outcome.get("errno") is not None:
            raise cls(outcome["errno"], outcome["strerror"], outcome["filename"])
        try:
            err = cls(message)
        except TypeError:  # a type that takes more than a message
            err = None
        if isinstance(err, Exception):
            raise err
    raise RuntimeError(f"{name}: {message}")


def run(
    model: str | os.PathLike[str],
    prompts: str | os.PathLike[str] | Sequence[str | dict[str, Any]],
    out_dir: str | os.PathLike[str],
    **options: Any,
) -> pl.DataFrame:
    """:func:`kvfast.probe.run` in a child process (same arguments, same manifest returned): a
    crash of llama.cpp raises :class:`ProbeCrashError` here instead of ending this process."""
    payload = _payload(model, prompts, out_dir, options)
    read_end, write_end = os.pipe()
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "kvfast.probe.guard", str(write_end)],
            stdin=subprocess.PIPE,
            pass_fds=(write_end,),
        )
    finally:
        os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as result:
            assert child.stdin is not None
            child.stdin.write(payload.encode())
            child.stdin.close()
            raw = result.read()
        code = child.wait()
    except BaseException:  # interrupted here (Ctrl-C): the child does not outlive the call
        child.kill()
        child.wait()
        raise
    if code < 0:
        raise ProbeCrashError(crash_message(-code), -code)
    outcome = json.loads(raw) if raw else None
    if outcome is not None and "error" in outcome:
        _raise_from(outcome)
    if code != 0 or outcome is None:
        raise RuntimeError(f"the probe's process ended with status {code} and no result")
    return pl.read_parquet(Path(out_dir) / MANIFEST)


def _child(fd: int) -> None:
    import faulthandler

    faulthandler.enable()  # a native crash prints the Python stack before the process dies
    spec = json.loads(sys.stdin.read())
    outcome: dict[str, Any]
    try:
        from kvfast.probe import runner as probe

        probe.run(spec["model"], spec["prompts"], spec["out_dir"], **spec["options"])
        outcome = {"ok": True}
    except Exception as e:  # noqa: BLE001 - every error goes back to the caller
        outcome = {"error": type(e).__name__, "message": str(e)}
        if isinstance(e, OSError):
            outcome.update(errno=e.errno, strerror=e.strerror, filename=e.filename)
    with os.fdopen(fd, "w") as f:
        json.dump(outcome, f)


if __name__ == "__main__":
    _child(int(sys.argv[1]))
