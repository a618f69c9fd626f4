"""The probe runner: drive llama.cpp over many prompts and save every sequence's state, plus a
manifest, so that a whole experiment is one command.

Needs llama-cpp-python (``pip install 'kvfast[probe]'``): its C API bindings load the model, decode
batches of parallel sequences in one context (one ``llama_decode`` over several sequences), and save
each sequence with ``llama_state_seq_save_file`` (GGSQ, tokens included). It runs on CUDA when
llama-cpp-python was built with ``CMAKE_ARGS="-DGGML_CUDA=on"``, on the CPU otherwise.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl

from kvfast import _kvfast
from kvfast.errors import ProbeError
from kvfast.model.geometry import ModelGeometry
from kvfast.probe import checks, rerun
from kvfast.probe import manifest as probe_manifest
from kvfast.read import regular
from kvfast.read.ggml import TYPES
from kvfast.writing import output

#: The manifest's file name in the output folder (where kvfast.open finds it).
MANIFEST = probe_manifest.NAME


@dataclass
class Prompt:
    id: str
    text: str | None = None
    tokens: list[int] | None = None
    ids: list[int] = field(default_factory=list)  # tokens as decoded (prefix excluded)


def _jsonl(path: Path) -> list[Any]:
    """The values of a JSONL prompts file, one per non-blank line; a line that is not JSON is a
    ProbeError naming the file, the line and what was expected."""
    items = []
    for n, ln in enumerate(regular.read_text(path).splitlines(), 1):
        if not ln.strip():
            continue
        try:
            items.append(json.loads(ln))
        except json.JSONDecodeError as e:
            raise ProbeError(
                f"{path}, line {n}, column {e.colno}: not JSON ({e.msg}): expected one JSON object per"
                ' line, {"id": ..., "prompt": "text"} or {"id": ..., "tokens": [ids]}',
                "prompts",
            ) from None
    return items


def load_prompts(source: str | os.PathLike[str] | Sequence[str | dict[str, Any]]) -> list[Prompt]:
    """Prompts from a text file (one per line), a JSONL file (``id`` and ``prompt`` or ``tokens``),
    or a list of strings or such dicts."""
    items: list[Any]
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.suffix == ".jsonl":
            items = _jsonl(path)
        else:
            items = [ln for ln in regular.read_text(path).splitlines() if ln.strip()]
    else:
        items = list(source)
    out = []
    for i, it in enumerate(items):
        if isinstance(it, str):
            out.append(Prompt(id=f"p{i:05d}", text=it))
            continue
        if not isinstance(it, dict):
            raise ProbeError(
                f"prompt {i + 1}: expected a string or an object (id, prompt or tokens), found "
                f"{type(it).__name__} {json.dumps(it)[:40]}",
                "prompts",
            )
        pid = str(it.get("id", f"p{i:05d}"))
        if "tokens" in it:
            out.append(Prompt(id=pid, tokens=checks.token_ids(pid, it["tokens"]), text=it.get("prompt")))
        elif "prompt" in it:
            out.append(Prompt(id=pid, text=str(it["prompt"])))
        else:
            raise ProbeError(f"prompt {pid}: needs 'prompt' or 'tokens'", "prompts")
    ids = [p.id for p in out]
    if len(set(ids)) != len(ids):
        raise ProbeError("prompt ids must be unique", "id")
    for pid in ids:
        checks.prompt_id(pid)
    return out


_LOG_CALLBACK: Any = None
GGML_LOG_LEVEL_ERROR = 4


def bindings(verbose: bool = False) -> Any:
    """The llama_cpp bindings, with llama.cpp's log cut to its errors unless `verbose`."""
    global _LOG_CALLBACK
    try:
        import llama_cpp
    except ImportError as e:
        raise ImportError("the probe runner needs llama-cpp-python: pip install 'kvfast[probe]'") from e
    if not verbose:

        def quiet(level: int, text: bytes, _: Any) -> None:
            if level == GGML_LOG_LEVEL_ERROR:
                sys.stderr.write(text.decode("utf-8", errors="replace"))

        _LOG_CALLBACK = llama_cpp.llama_log_callback(quiet)  # kept alive: llama.cpp holds the pointer
        llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
    return llama_cpp


class Runner:
    """One model and one context, reused for every batch."""

    def __init__(
        self,
        model: str,
        *,
        ctk: str,
        ctv: str,
        fa: bool,
        parallel: int,
        n_ctx: int,
        gpu_layers: int,
        unified: bool,
        verbose: bool = False,
        capture: Any = None,
        swa_full: bool = False,
    ) -> None:
        for t in (ctk, ctv):
            if t not in TYPES:
                raise ValueError(f"unknown cache type {t!r}: one of {', '.join(TYPES)}")
        L = self.L = bindings(verbose)
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = gpu_layers
        self.model = L.llama_model_load_from_file(os.fsencode(model), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {model}")
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_ctx
        cp.n_ubatch = min(n_ctx, 512)
        cp.n_seq_max = parallel
        cp.type_k = TYPES[ctk].id
        cp.type_v = TYPES[ctv].id
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if fa else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.kv_unified = unified
        cp.n_threads = cp.n_threads_batch = os.cpu_count() or 1
        self.capture = capture  # kept alive: llama.cpp holds its callback
        if capture is not None:  # a kvfast.attn.capture.Capture: the graph callback
            from kvfast.attn.capture import install

            install(cp, capture)
        # a sliding-window cache sized for every cell the captured queries saw
        cp.swa_full = swa_full or capture is not None
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create the context (cache types, flash attention, size?)")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        # llama.cpp aborts on tokenizing or rendering pieces without a tokenizer: check first
        self.has_tokenizer = L.llama_vocab_type(self.vocab) != L.LLAMA_VOCAB_TYPE_NONE
        self.mem = L.llama_get_memory(self.ctx)
        # llama.cpp may round the context up; plan with what was asked (it is also n_batch)
        self.n_ctx = min(n_ctx, L.llama_n_ctx(self.ctx))
        self.n_batch = n_ctx
        self.parallel = parallel

    def close(self) -> None:
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        if not self.has_tokenizer:
            raise ValueError("the model has no tokenizer: give prompts as token ids (JSONL 'tokens')")
        data = text.encode()
        buf = (self.L.llama_token * (len(data) + 16))()
        n = self.L.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special, False)
        if n < 0:
            buf = (self.L.llama_token * (-n))()
            n = self.L.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special, False)
        if n < 0:
            raise RuntimeError(f"cannot tokenize {text[:40]!r} (has the model a tokenizer?)")
        return list(buf[:n])

    def piece(self, token: int) -> str | None:
        if not self.has_tokenizer:
            return None
        buf = ctypes.create_string_buffer(64)
        n = self.L.llama_token_to_piece(self.vocab, token, buf, 64, 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self.L.llama_token_to_piece(self.vocab, token, buf, -n, 0, True)
        return buf.raw[: max(n, 0)].decode("utf-8", errors="replace")

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode over (token, pos, seq, wants logits) entries."""
        if len(entries) > self.n_batch:  # llama.cpp would abort the process
            raise RuntimeError(f"{len(entries)} tokens in one batch > n_batch {self.n_batch}")
        L = self.L
        batch = L.llama_batch_init(len(entries), 0, 1)
        try:
            batch.n_tokens = len(entries)
            for i, (tok, pos, seq, logits) in enumerate(entries):
                batch.token[i] = tok
                batch.pos[i] = pos
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = logits
            rc = L.llama_decode(self.ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed ({rc}): is the context large enough?")
        finally:
            L.llama_batch_free(batch)

    def argmax(self, i: int) -> int:
        ptr = self.L.llama_get_logits_ith(self.ctx, i)
        return int(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())

    def clear(self) -> None:
        self.L.llama_memory_clear(self.mem, True)

    def share(self, src: int, dst: int) -> None:
        self.L.llama_memory_seq_cp(self.mem, src, dst, -1, -1)

    def save_seq(self, path: Path, seq: int, tokens: list[int], guard_manifest: bool = False) -> None:
        """Save a sequence as llama_state_seq_save_file writes it, whole or not at all
        (:mod:`kvfast.writing.output`; `guard_manifest`: refuse a name a probe manifest beside it
        gives, as for a file the user names, not for the run's own states)."""
        arr = (self.L.llama_token * len(tokens))(*tokens)
        with output.replacing(path, guard_manifest=guard_manifest) as tmp:
            if not self.L.llama_state_seq_save_file(self.ctx, os.fsencode(tmp), seq, arr, len(tokens)):
                raise RuntimeError(f"llama_state_seq_save_file failed for sequence {seq}")

    def save_whole(self, path: Path, guard_manifest: bool = False) -> None:
        """Save the whole context as llama_state_get_data gives it (as :meth:`save_seq`)."""
        n = self.L.llama_state_get_size(self.ctx)
        buf = (ctypes.c_uint8 * n)()
        written = self.L.llama_state_get_data(self.ctx, buf, n)
        with output.replacing(path, guard_manifest=guard_manifest) as tmp:
            tmp.write_bytes(memoryview(buf)[:written])

    def rotates(self) -> tuple[bool, str | None]:
        """Whether this llama.cpp stores quantized caches Hadamard-rotated (its library has the
        rotation, as builds since April 2026 do, and LLAMA_ATTN_ROT_DISABLE does not turn it off),
        and the value of that variable."""
        env = os.environ.get("LLAMA_ATTN_ROT_DISABLE")
        lib = Path(self.L.__file__).parent / "lib"
        has = any(b"attn_rot_k" in f.read_bytes() for f in lib.glob("libllama*") if f.is_file())
        disabled = env is not None and env.strip().lstrip("-").isdigit() and int(env) != 0
        return has and not disabled, env

    def build(self) -> str:
        info = self.L.llama_print_system_info()
        sysinfo = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
        return f"llama-cpp-python {getattr(self.L, '__version__', '?')}; {sysinfo.strip()}"


def _geometry(model: str) -> dict[str, Any]:
    g = ModelGeometry.from_gguf(model)
    meta = _kvfast.gguf_metadata(model)
    return {
        "arch": g.arch,
        "n_layer": g.n_layer,
        "n_head": int(meta.get(f"{g.arch}.attention.head_count", 0) or 0),
        "n_head_kv": list(g.n_head_kv),
        "head_dim_k": g.head_dim_k,
        "head_dim_v": g.head_dim_v,
        "swa": list(g.swa),
        # the memory: which layers are recurrent / attention (None: not known), K only (MLA)
        "recurrent": None if g.recurrent is None else list(g.recurrent),
        "attention": None if g.attention is None else list(g.attention),
        "v_less": g.v_less,
        "n_layer_trunk": g.n_layer_trunk,
        # the memory's parts the layers alone do not give (Gemma 4's window heads, an indexer cache)
        "head_dims_swa": None if g.head_dims_swa is None else list(g.head_dims_swa),
        "indexer": None
        if g.indexer is None
        else {
            "layers": list(g.indexer.layers),
            "head_dim_k": g.indexer.head_dim_k,
            "head_dim_v": g.indexer.head_dim_v,
            "k_rotation": g.indexer.k_rotation,
        },
    }


def _batches(prompts: list[Prompt], parallel: int, budget: int, prefix: int) -> Iterator[list[Prompt]]:
    """Groups of at most `parallel` prompts whose cells fit the context (the prefix counted once)."""
    group: list[Prompt] = []
    used = prefix
    for p in prompts:
        if group and (len(group) == parallel or used + len(p.ids) > budget):
            yield group
            group, used = [], prefix
        group.append(p)
        used += len(p.ids)
    if group:
        yield group


@checks.exclusive
def run(
    model: str | os.PathLike[str],
    prompts: str | os.PathLike[str] | Sequence[str | dict[str, Any]],
    out_dir: str | os.PathLike[str],
    *,
    ctk: str = "f16",
    ctv: str = "f16",
    fa: bool = True,
    parallel: int = 1,
    n_ctx: int = 4096,
    gpu_layers: int = 0,
    generate: int = 0,
    shared_prefix: str | Sequence[int] | None = None,
    unified: bool = True,
    whole_state: bool = False,
    progress: bool = True,
    verbose: bool = False,
    queries: int | Literal["all"] | None = None,
) -> pl.DataFrame:
    """Run every prompt and save its sequence's state (``OUT/<id>.ggsq``), optionally the whole
    context of each batch (``OUT/batch-NNNNN.state``), and the manifest (``OUT/manifest.parquet``).

    ``queries=W`` also captures each attention layer's query vectors of the last ``W`` positions of
    each prompt (``"all"``: every position of the prompt; the shared prefix's are not captured) and
    of its generated tokens, from llama.cpp's graph, into ``OUT/<id>.queries.npy`` and its sidecar
    ``OUT/<id>.queries.json`` (the manifest's ``queries`` column; see :mod:`kvfast.attn.capture`).
    The prompts of a batch are then decoded one sequence at a time, with the sliding-window cache
    kept whole (``swa_full``).

    A prompt longer than the context is reported (status ``too_long``) and skipped, never truncated.
    A state already in the manifest and on disk is kept when it was made with this run's settings
    and tokens (an interrupted run resumes); one made with other settings (cache types, flash
    attention, context, model, generation, queries window, shared prefix, the prompt's text or
    tokens) is made again, its old files removed first (:mod:`kvfast.probe.rerun`). Returns the
    manifest; its ``rerun`` column says which rows this run made (``new``, ``redone``), ``kept`` or
    left (``other``: prompts it was not given), ``changed`` what differed for a row made again.
    """
    model = os.fspath(model)
    out = output.folder(out_dir)
    todo = load_prompts(prompts)
    old = pl.read_parquet(out / MANIFEST) if (out / MANIFEST).exists() else None
    earlier = {} if old is None else {r["prompt_id"]: r for r in old.iter_rows(named=True)}
    geometry = _geometry(model)
    capture = None
    if queries is not None:
        if queries != "all" and (not isinstance(queries, int) or isinstance(queries, bool) or queries < 1):
            raise ValueError(f"queries must be a positive window or 'all', not {queries!r}")
        from kvfast.attn.capture import Capture

        layers = _kvfast.attention_layers(model)
        if not layers:
            raise ValueError(f"{model}: the model has no attention layer, so no query to capture")
        capture = Capture(layers)
    r = Runner(
        model,
        ctk=ctk,
        ctv=ctv,
        fa=fa,
        parallel=parallel,
        n_ctx=n_ctx,
        gpu_layers=gpu_layers,
        unified=unified,
        capture=capture,
    )
    build = r.build()
    rotates, rot_env = r.rotates()
    config = {
        "model": model,
        **geometry,
        "ctk": ctk,
        "ctv": ctv,
        "fa": fa,
        "n_ctx": r.n_ctx,
        "parallel": parallel,
        "unified": unified,
        "generate": generate,
        "gpu_layers": gpu_layers,
        "llama_build": build,
        "attn_rot": rotates,
        "attn_rot_disable_env": rot_env,
        "queries_window": None if queries is None else str(queries),
    }
    prefix: list[int] = []
    if shared_prefix is not None:
        prefix = (
            r.tokenize(shared_prefix, True)
            if isinstance(shared_prefix, str)
            else checks.token_ids("shared prefix", list(shared_prefix), "shared_prefix")
        )
    per_seq = r.n_ctx if unified else r.n_ctx // parallel
    rows: list[dict[str, Any]] = []
    runnable = []
    outcome: dict[str, str] = {}
    why: dict[str, list[str]] = {}
    stale: list[Path] = []
    for p in todo:
        p.ids = p.tokens if p.tokens is not None else r.tokenize(p.text or "", not prefix)
        diff = rerun.changed(earlier.get(p.id), config, prefix, p.text, p.ids, out, whole_state)
        if diff == []:
            outcome[p.id] = "kept"
            continue
        outcome[p.id] = "new" if diff is None else "redone"
        if diff:  # never keep a state made with other settings under its name
            why[p.id] = diff
            stale += rerun.files_of(earlier[p.id], out)
        if len(prefix) + len(p.ids) + generate > per_seq or not p.ids:
            rows.append(
                {
                    **_row(p, "too_long", config, prefix),
                    "error": f"{len(prefix) + len(p.ids) + generate} tokens > {per_seq}",
                }
            )
            continue
        runnable.append(p)
    try:  # llama.cpp refuses a batch with a token not in the vocabulary: say which, before any decode
        checks.vocabulary(runnable, prefix, r.n_vocab)
    except ProbeError:
        r.close()
        raise
    rerun.remove(stale)
    labels = (outcome, why)
    try:
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(runnable), unit="prompt", desc="kvfast probe", disable=None, file=sys.stderr)
        budget = r.n_ctx - parallel * generate if unified else per_seq
        for bi, group in enumerate(_batches(runnable, parallel, budget, len(prefix))):
            window = None if queries in (None, "all") else int(queries)
            rows.extend(_run_batch(r, group, prefix, generate, out, bi, whole_state, config, capture, window))
            if bar is not None:
                bar.update(len(group))
            _write_manifest(out, old, rows, labels)
        if bar is not None:
            bar.close()
    finally:
        r.close()
    final = _write_manifest(out, old, rows, labels)
    if old is not None and "whole_state" in final.columns:  # earlier batches' whole states no row names
        named = set(final["whole_state"].drop_nulls().to_list())
        rerun.remove(
            [f for n in set(old["whole_state"].drop_nulls()) - named if (f := rerun.named_file(out, n))]
        )
    return final


def _row(p: Prompt, status: str, config: dict[str, Any], prefix: list[int]) -> dict[str, Any]:
    return {
        "prompt_id": p.id,
        "prompt": p.text,
        "status": status,
        "prefix_tokens": prefix,
        "tokens": p.ids,
        "pieces": [],
        "generated": [],
        "seq_id": None,
        "batch": None,
        "state": None,
        "size": None,
        "whole_state": None,
        "decode_ms": None,
        "save_ms": None,
        "error": None,
        "queries": None,
        **config,
    }


def _run_batch(
    r: Runner,
    group: list[Prompt],
    prefix: list[int],
    generate: int,
    out: Path,
    bi: int,
    whole: bool,
    config: dict[str, Any],
    capture: Any = None,
    window: int | None = None,
) -> list[dict[str, Any]]:
    t0 = time.perf_counter()
    r.clear()
    if prefix:
        r.decode([(t, i, 0, False) for i, t in enumerate(prefix)])
        for s in range(1, len(group)):
            r.share(0, s)
    if capture is not None:
        from kvfast.attn.capture import decode_group, write_sidecar

        generated, writers, seq_rows = decode_group(r, group, prefix, generate, capture, window, out)
    else:
        generated = _decode_batch(r, group, prefix, generate)
    decode_ms = (time.perf_counter() - t0) * 1000
    rows = []
    whole_name = None
    if whole:
        whole_name = f"batch-{bi:05d}-{group[0].id}.state"
        r.save_whole(out / whole_name)
    for s, p in enumerate(group):
        t1 = time.perf_counter()
        name = f"{p.id}.ggsq"
        tokens = prefix + p.ids + generated[s]
        r.save_seq(out / name, s, tokens)
        row = _row(p, "ok", config, prefix)
        row.update(
            pieces=[r.piece(t) for t in tokens],
            generated=generated[s],
            seq_id=s,
            batch=bi,
            state=name,
            size=(out / name).stat().st_size,
            whole_state=whole_name,
            decode_ms=decode_ms,
            save_ms=(time.perf_counter() - t1) * 1000,
        )
        if capture is not None:
            meta = {"model": config["model"], "arch": config["arch"], "prompt_id": p.id, "state": name}
            row["queries"] = write_sidecar(
                writers[s], capture, {**meta, "whole_state": whole_name}, seq_rows[s]
            )
        rows.append(row)
    return rows


def _decode_batch(r: Runner, group: list[Prompt], prefix: list[int], generate: int) -> list[list[int]]:
    """Decode a batch's prompts in one llama_decode, then `generate` tokens of each, one decode
    per step; the tokens generated."""
    entries: list[tuple[int, int, int, bool]] = []
    last: dict[int, int] = {}
    for s, p in enumerate(group):
        for i, t in enumerate(p.ids):
            is_last = i == len(p.ids) - 1
            if is_last:
                last[s] = len(entries)
            entries.append((t, len(prefix) + i, s, is_last and generate > 0))
    r.decode(entries)
    generated: list[list[int]] = [[] for _ in group]
    for step in range(generate):
        nxt = [r.argmax(last[s] if step == 0 else s) for s in range(len(group))]
        for s, t in enumerate(nxt):
            generated[s].append(t)
        r.decode([(t, len(prefix) + len(group[s].ids) + step, s, True) for s, t in enumerate(nxt)])
    return generated


def _write_manifest(
    out: Path,
    old: pl.DataFrame | None,
    rows: list[dict[str, Any]],
    labels: tuple[dict[str, str], dict[str, list[str]]] = ({}, {}),
) -> pl.DataFrame:
    new = pl.DataFrame(rows, infer_schema_length=None) if rows else None
    frames = [f for f in (old, new) if f is not None]
    if not frames:
        return pl.DataFrame()
    df = pl.concat(frames, how="diagonal_relaxed") if len(frames) > 1 else frames[0]
    df = rerun.label(df.unique("prompt_id", keep="last", maintain_order=True), *labels)
    with output.replacing(out / MANIFEST, guard_manifest=False) as tmp:
        df.write_parquet(tmp)
    return df
