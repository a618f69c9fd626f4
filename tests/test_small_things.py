"""Small things that each cost a user minutes (issue 14): messages, reprs, counts, CLI options."""

from pathlib import Path

import pytest

import kvfast
from kvfast.cli import main


@pytest.mark.parametrize("text", ["hello\n", "prompt,id\nThe cat sat,1\n" * 30])
def test_a_text_file_is_not_a_state(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "notes.txt"
    f.write_text(text)
    with pytest.raises(kvfast.FormatError, match="not a llama.cpp state") as e:
        kvfast.open(f)
    assert not isinstance(e.value, kvfast.TruncatedError)
    assert (e.value.offset, e.value.field) == (0, "magic")
    assert main(["info", str(f)]) == 1
    err = capsys.readouterr().err
    assert "not a llama.cpp state" in err and "cells" not in err.split("(no magic")[0]
