"""Independent NumPy decoders of ggml block types, written from the format description."""

import numpy as np

IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
BLOCK = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "iq4_nl": 18}


def decode(type_name: str, raw: bytes) -> np.ndarray:
    """Values of `raw` (whole blocks or plain floats) as float32, one f32 multiply (+ m) per value."""
    if type_name == "f32":
        return np.frombuffer(raw, "<f4").astype(np.float32)
    if type_name == "f16":
        return np.frombuffer(raw, "<f2").astype(np.float32)
    if type_name == "bf16":
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    b = np.frombuffer(raw, np.uint8).reshape(-1, BLOCK[type_name])
    d = b[:, 0:2].copy().view("<f2").astype(np.float32)
    if type_name == "q8_0":
        return (b[:, 2:].view(np.int8).astype(np.float32) * d).ravel()
    if type_name in ("q4_1", "q5_1"):
        m = b[:, 2:4].copy().view("<f2").astype(np.float32)
        rest = b[:, 4:]
    else:
        m, rest = None, b[:, 2:]
    if type_name.startswith("q5"):
        qh = rest[:, :4].copy().view("<u4")[:, 0]
        qs = rest[:, 4:]
        bits = (qh[:, None] >> np.arange(32, dtype=np.uint32)) & 1
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32) | (bits.astype(np.int32) << 4)
    else:
        qs = rest
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32)
    if type_name == "iq4_nl":
        return (d * IQ4NL[q]).ravel()
    if m is not None:
        return (q.astype(np.float32) * d + m).ravel()
    offset = 16 if type_name == "q5_0" else 8
    return ((q - offset).astype(np.float32) * d).ravel()


def hadamard(x: np.ndarray, n: int) -> np.ndarray:
    """Every group of ``n`` values of each row times the orthonormal Hadamard matrix (Sylvester
    order, float64): an independent check of kvfast-core's transform."""
    rows = x.reshape(-1, n).astype(np.float64)
    h = 1
    while h < n:
        r = rows.reshape(-1, n // (2 * h), 2, h)
        a, b = r[:, :, 0, :].copy(), r[:, :, 1, :].copy()
        r[:, :, 0, :], r[:, :, 1, :] = a + b, a - b
        rows = r.reshape(-1, n)
        h *= 2
    return (rows / np.sqrt(n)).reshape(x.shape)
