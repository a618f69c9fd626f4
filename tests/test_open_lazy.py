"""Opening a state builds no Python object per cell: positions and sequences are NumPy arrays (the
sequences in CSR form), and the per-cell lists of ``Stream.seq_ids`` are built when first asked for."""

from pathlib import Path

import numpy as np
import pytest

import kvfast
from kvfast import synth


def test_cells_are_arrays_and_seq_ids_are_built_on_first_use(state_file: Path) -> None:
    with kvfast.open(state_file, rotation="none") as d:
        for c in d.caches:
            for s in c.streams:
                assert "seq_ids" not in vars(s)  # not built at open
                assert s.pos.dtype == np.int32 and s.pos.shape == (s.cell_count,)
                starts, values = s.seq_id_starts, s.seq_id_values
                assert starts.dtype == values.dtype == np.int32
                assert len(starts) == (s.cell_count + 1 if s.cell_count else 0)
                cells = [s.cell_seq_ids(i) for i in range(s.cell_count)]
                assert "seq_ids" not in vars(s)  # one cell's sequences build no list per cell
                lists = s.seq_ids
                assert cells == lists
                assert "seq_ids" in vars(s) and s.seq_ids is lists  # built once
                assert len(lists) == s.cell_count
                flat = [q for ids in lists for q in ids]
                assert flat == values.tolist()
                assert s.sequences == sorted(set(flat))
                assert s.shared_cells == sum(1 for ids in lists if len(ids) > 1)


def test_a_large_state_opens_without_lists_per_cell(tmp_path: Path) -> None:
    p = tmp_path / "big.bin"
    cells = 50_000
    synth.write_state(p, cells=cells, n_layer=1, n_embd_k=32, seq_id=3)
    with kvfast.open(p, rotation="none") as d:
        s = d.caches[0].streams[0]
        assert s.cell_count == cells
        assert "seq_ids" not in vars(s)
        assert s.sequences == [3] and s.shared_cells == 0
        np.testing.assert_array_equal(s.pos, np.arange(cells, dtype=np.int32))
        assert not s.pos.flags.writeable  # a view of the walk's buffer, not a copy
        assert s.cell_seq_ids(cells - 1) == [3]
        for bad in (cells, -1, "0", True):
            with pytest.raises(kvfast.SelectionError, match="out of range: stream 0 has 50000 cells"):
                s.cell_seq_ids(bad)  # type: ignore[arg-type]
        assert repr(s).startswith("Stream(index=0, cells=50000, pos=0..49999, seq_ids=[3]")
