"""Seed each fuzz target's corpus (fuzz/corpus/<target>/, not in git) from the fixtures in tests/data
and a few built states; a corpus that already holds files is left as the fuzzer grew it."""

import random
import struct
from pathlib import Path

FUZZ = Path(__file__).parent
DATA = FUZZ.parent / "tests" / "data"
TYPES = 9  # the fuzz targets pick a type as byte % 9


def fixtures(limit: int = 16_000) -> list[Path]:
    files = [p for p in DATA.glob("*/*") if p.suffix in (".bin", ".ggsq", ".ggsn")]
    return sorted(p for p in files if p.stat().st_size <= limit)


def stream(cells: int, row_bytes: tuple[int, int], v_trans: bool = False) -> bytes:
    """One stream of f16 rows (sequence 0), one layer."""
    out = struct.pack("<I", cells)
    for p in range(cells):
        out += struct.pack("<iIi", p, 1, 0)
    out += struct.pack("<II", int(v_trans), 1)
    for i, rb in enumerate(row_bytes):
        if i == 1 and v_trans:
            out += struct.pack("<iII", 1, 2, rb // 2)
        else:
            out += struct.pack("<iQ", 1, rb)
        out += bytes((7 * j + 1) % 251 for j in range(rb * cells))
    return out


def built_states() -> dict[str, bytes]:
    """Several streams in one cache (the fixtures have one each): agreeing, and the two-width
    reproducer of issue 11 (which the walker refuses)."""
    head = lambda n: struct.pack("<IiI", 0xAF143CD8, 0, n)
    return {
        "two-streams.bin": head(2) + stream(2, (128, 128)) + stream(3, (128, 128)),
        "two-streams-vtrans.bin": head(2) + stream(2, (64, 64), True) + stream(1, (64, 64), True),
        "two-widths.bin": head(2) + stream(2, (16, 16)) + stream(2, (128, 128)),
    }


def write(target: str, seeds: dict[str, bytes]) -> None:
    d = FUZZ / "corpus" / target
    d.mkdir(parents=True, exist_ok=True)
    if any(d.iterdir()):
        return
    for name, b in seeds.items():
        (d / name).write_bytes(b)
    print(f"fuzz/corpus/{target}: {len(seeds)} seeds")


def main() -> None:
    rng = random.Random(11)
    states = {f"{p.parent.name}-{p.name}": p.read_bytes() for p in fixtures()}
    states.update(built_states())
    write("open", states)
    write("stats", states)
    pairs = {}
    for p in fixtures():
        for q in p.parent.iterdir():
            if q.suffix == p.suffix and q != p and q.stat().st_size <= 16_000:
                a, b = p.read_bytes(), q.read_bytes()
                pairs[f"{p.parent.name}-{p.stem}-{q.stem}{p.suffix}"] = struct.pack("<IB", len(a), 64) + a + b
    write("compare", pairs)
    rows = (DATA / "qwen3tiny-q8_0-fa" / "seq-0.bin").read_bytes()[-1024:]
    write(
        "decode",
        {
            f"t{t}-m{m}": bytes([t, m]) + struct.pack("<HHH", 64, 64, 4) + rows
            for t in range(TYPES)
            for m in range(4)
        },
    )

    def floats(xs: list[float]) -> bytes:
        return struct.pack(f"<{len(xs)}f", *xs)

    quant = {}
    for t in range(TYPES):
        quant[f"t{t}-normal"] = bytes([t, 0]) + floats([rng.gauss(0, 2) for _ in range(64)])
        quant[f"t{t}-special"] = bytes([t, 3]) + floats(
            [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, 3e38, -3e38] * 4
        )
    write("quantize", quant)


if __name__ == "__main__":
    main()
