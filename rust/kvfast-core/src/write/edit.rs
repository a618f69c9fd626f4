//! Edits on a state's parts ([`super::parts`]) that keep the rules of the bytes: cells dropped with
//! their rows in every record; sequences renamed, extracted or joined; records requantized
//! (llama.cpp's rotation undone and applied again) or given new values; the parts brought to
//! another container's format.

use crate::format::container::{is_arch_name, MAX_ARCH_LEN};
use crate::format::layout::{Container, Kind, Memory};
use crate::format::types::GgmlType;
use crate::write::check::{self, sequences as seqs_of};
use crate::write::parts::{CacheParts, Format, Rows, StateParts, StreamParts};
use crate::write::{err, seq_id, Result, WriteError};

/// llama.cpp's LLAMA_TOKEN_NULL: the token of a cell the extension knows none for.
pub const TOKEN_NULL: i32 = -1;

/// A retyping of one kind of one cache: the target type, the group its rows are stored rotated in
/// now and the group the target type is stored rotated in (0: not rotated).
#[derive(Debug, Clone, Copy)]
pub struct Retype {
    pub cache: usize,
    pub kind: Kind,
    pub ty: GgmlType,
    pub from_group: usize,
    pub to_group: usize,
}

/// New values for one record: f32 in the model's basis, a row per cell (the cells before any is
/// dropped), stored in the record's type rotated in `group`.
#[derive(Debug, Clone)]
pub struct Replace {
    pub cache: usize,
    pub stream: usize,
    pub layer: usize,
    pub kind: Kind,
    pub values: Vec<f32>,
    pub group: usize,
}

fn stream_at(parts: &mut StateParts, cache: usize, stream: usize) -> Result<&mut StreamParts> {
    let n = parts.caches.len();
    let c = parts
        .caches
        .get_mut(cache)
        .ok_or_else(|| err("cache", "values", format!("a cache below {n}"), cache))?;
    let ns = c.streams.len();
    c.streams.get_mut(stream).ok_or_else(|| {
        err(
            format!("cache {cache} stream"),
            "values",
            format!("a stream below {ns}"),
            stream,
        )
    })
}

impl StateParts {
    /// Keep the cells `keep[cache][stream][cell]` says, with their rows in every record (a cache
    /// left out of `keep`, and the recurrent part, keep every cell).
    pub fn keep(&mut self, keep: &[Vec<Vec<bool>>]) -> Result<()> {
        for (ci, (c, kc)) in self.caches.iter_mut().zip(keep).enumerate() {
            if kc.is_empty() {
                continue;
            }
            if c.memory.is_recurrent() && kc.iter().flatten().any(|k| !k) {
                return Err(err(
                    format!("cache {ci} cells"), "keep",
                    "every cell of the recurrent part (one per sequence: drop a sequence with seq_id=)",
                    "cells dropped",
                ));
            }
            if kc.len() != c.streams.len() {
                return Err(err(
                    format!("cache {ci} keep"),
                    "keep",
                    format!("a mask for each of its {} streams", c.streams.len()),
                    kc.len(),
                ));
            }
            for (si, (s, ks)) in c.streams.iter_mut().zip(kc).enumerate() {
                if ks.len() != s.cells.len() {
                    return Err(err(
                        format!("cache {ci} stream {si} keep"),
                        "keep",
                        format!("a flag for each of its {} cells", s.cells.len()),
                        ks.len(),
                    ));
                }
                let mut it = ks.iter();
                s.cells.retain(|_| *it.next().unwrap_or(&true));
                for (k, v) in &mut s.layers {
                    k.keep(ks);
                    if let Some(v) = v {
                        v.keep(ks);
                    }
                }
                if s.cells.is_empty() && !c.memory.is_recurrent() {
                    s.layers.clear();
                    s.v_trans = false;
                }
            }
        }
        Ok(())
    }

    /// Rename sequences: every `(from, to)` pair, in every cell and the io header at once.
    pub fn rename(&mut self, map: &[(i32, i32)]) -> Result<()> {
        for &(_, to) in map {
            seq_id(to.into())?;
        }
        let f = |q: i32| map.iter().find(|m| m.0 == q).map_or(q, |m| m.1);
        self.seq_id = self.seq_id.map(f);
        for c in &mut self.caches {
            for s in &mut c.streams {
                // two sequences renamed to one must not meet at a position (one sequence may
                // hold a position twice: M-RoPE image tokens, llama_memory_seq_div)
                let mut seen: Vec<(i32, i32, i32)> = s
                    .cells
                    .iter()
                    .flat_map(|c| c.seqs.iter().map(|&q| (f(q), c.pos, q)))
                    .collect();
                seen.sort_unstable();
                if let Some(w) = seen
                    .windows(2)
                    .find(|w| (w[0].0, w[0].1) == (w[1].0, w[1].1) && w[0].2 != w[1].2)
                {
                    return Err(err(
                        "seq_id",
                        "seq_id",
                        "one cell per sequence and position after renaming (two sequences \
                         renamed to one)",
                        format!(
                            "sequences {} and {} renamed to {} at position {}",
                            w[0].2, w[1].2, w[0].0, w[0].1
                        ),
                    ));
                }
                for (i, cell) in s.cells.iter_mut().enumerate() {
                    let mut seqs: Vec<i32> = cell.seqs.iter().map(|&q| f(q)).collect();
                    seqs.sort_unstable();
                    if seqs.windows(2).any(|w| w[0] == w[1]) {
                        return Err(err(
                            format!("cell {i} seq_id"),
                            "seq_id",
                            "distinct sequences after renaming",
                            format!("{:?} renamed to {seqs:?}", cell.seqs),
                        ));
                    }
                    cell.seqs = seqs;
                }
            }
        }
        Ok(())
    }

    /// Keep sequence `seq` alone, as a per-sequence save does: attention cells that hold it list
    /// it alone, the recurrent part's cell lists none; every other cell is dropped.
    pub fn extract(&mut self, seq: i32) -> Result<()> {
        let held = seqs_of(self);
        if !held.contains(&seq) {
            return Err(WriteError::request(
                "seq_id",
                format!("the state holds sequences {held:?}, not {seq}"),
            ));
        }
        let mut keep = Vec::new();
        for c in &self.caches {
            keep.push(
                c.streams
                    .iter()
                    .map(|s| {
                        s.cells
                            .iter()
                            .map(|cell| cell.seqs.is_empty() || cell.seqs.contains(&seq))
                            .collect::<Vec<_>>()
                    })
                    .collect::<Vec<_>>(),
            );
        }
        // the recurrent part's cells of other sequences go too (keep refuses that: do it here)
        for (c, kc) in self.caches.iter_mut().zip(&mut keep) {
            if c.memory.is_recurrent() {
                for (s, ks) in c.streams.iter_mut().zip(kc.iter_mut()) {
                    let mut it = ks.iter();
                    s.cells.retain(|_| *it.next().unwrap_or(&true));
                    for (r, v) in &mut s.layers {
                        r.keep(ks);
                        if let Some(v) = v {
                            v.keep(ks);
                        }
                    }
                    ks.clear();
                    ks.resize(s.cells.len(), true);
                }
            }
        }
        self.keep(&keep)?;
        for c in &mut self.caches {
            let recurrent = c.memory.is_recurrent();
            for s in &mut c.streams {
                for cell in &mut s.cells {
                    cell.seqs = if recurrent { vec![] } else { vec![seq] };
                }
            }
        }
        self.seq_id = Some(seq);
        Ok(())
    }

    /// Give every cell that lists no sequence (a per-sequence save of the recurrent part or of a
    /// 2025 build) the sequence `seq`, as a whole state lists it.
    pub fn own(&mut self, seq: i32) {
        for c in &mut self.caches {
            for s in &mut c.streams {
                for cell in &mut s.cells {
                    if cell.seqs.is_empty() {
                        cell.seqs.push(seq);
                    }
                }
            }
        }
    }

    /// In a sequence state, give the cells that list no sequence (the recurrent part's, every
    /// cell of a build before mid-2025) the state's own sequence (the io header's, the one its
    /// cells list, else 0), so that renaming and joining see every cell's sequence; written as a
    /// sequence state again, those cells list none as before ([`StateParts::to_format`]).
    pub fn own_sequence(&mut self) {
        if self.format.is_sequence() {
            let q = self.own_seq().unwrap_or(0);
            self.own(q);
        }
    }

    /// Store V transposed (element-major, as llama.cpp without flash attention keeps it) or not
    /// (a row per cell, with flash attention), in every attention cache. Only f32, f16 and bf16 V
    /// can be transposed.
    pub fn set_v_trans(&mut self, v_trans: bool) -> Result<()> {
        for (ci, c) in self.caches.iter_mut().enumerate() {
            if c.memory.is_recurrent() {
                continue;
            }
            for s in c.streams.iter_mut().filter(|s| !s.cells.is_empty()) {
                if v_trans {
                    if let Some(v) = s
                        .layers
                        .iter()
                        .filter_map(|l| l.1.as_ref())
                        .find(|v| !v.ty.is_float())
                    {
                        return Err(err(
                            format!("cache {ci} v type"),
                            "v_trans",
                            "f32, f16 or bf16 (only plain float V can be transposed)",
                            v.ty,
                        ));
                    }
                }
                s.v_trans = v_trans;
            }
        }
        Ok(())
    }

    /// Requantize one kind of one attention cache.
    pub fn retype(&mut self, r: Retype) -> Result<()> {
        let n = self.caches.len();
        let c = self.caches.get_mut(r.cache).ok_or_else(|| {
            err(
                "cache",
                format!("cache_type_{}", r.kind),
                format!("a cache below {n}"),
                r.cache,
            )
        })?;
        if c.memory.is_recurrent() || r.kind.is_recurrent() {
            return Err(err(
                format!("cache {} {} type", r.cache, r.kind),
                format!("cache_type_{}", r.kind),
                "K or V of an attention cache (llama.cpp keeps the recurrent part in f32)",
                r.kind,
            ));
        }
        for s in &mut c.streams {
            if s.v_trans && r.kind == Kind::V && !r.ty.is_float() {
                return Err(err(
                    format!("cache {} v type", r.cache), "cache_type_v",
                    "f32, f16 or bf16: this V is transposed (written without flash attention), and \
                     llama.cpp keeps a quantized V only with flash attention, untransposed",
                    r.ty,
                ));
            }
            for (k, v) in &mut s.layers {
                let rec = if r.kind == Kind::K {
                    Some(k)
                } else {
                    v.as_mut()
                };
                if let Some(rec) = rec {
                    if rec.ty == r.ty && r.from_group == r.to_group {
                        continue;
                    }
                    rec.retype(r.ty, r.from_group, r.to_group)?;
                }
            }
        }
        Ok(())
    }

    /// Give one record new values (before any cell is dropped).
    pub fn replace(&mut self, r: &Replace) -> Result<()> {
        let s = stream_at(self, r.cache, r.stream)?;
        let (nl, cells) = (s.layers.len(), s.cells.len());
        let layer = s.layers.get_mut(r.layer).ok_or_else(|| {
            err(
                format!("cache {} stream {} layer", r.cache, r.stream),
                "values",
                format!("a layer below {nl}"),
                r.layer,
            )
        })?;
        let rec = if layer.0.kind == r.kind {
            &mut layer.0
        } else {
            match layer.1.as_mut().filter(|v| v.kind == r.kind) {
                Some(v) => v,
                None => {
                    return Err(err(
                        format!("cache {} layer {} kind", r.cache, r.layer),
                        "values",
                        "a kind the layer has a record of",
                        r.kind,
                    ))
                }
            }
        };
        let want = cells * rec.n_embd as usize;
        if r.values.len() != want {
            return Err(err(
                format!(
                    "cache {} stream {} layer {} {} values",
                    r.cache, r.stream, r.layer, r.kind
                ),
                "values",
                format!("{cells} cells x {} values = {want}", rec.n_embd),
                r.values.len(),
            ));
        }
        let ty = rec.ty;
        rec.store(ty, &r.values, r.group)
    }

    /// Bring the parts to `format`: a whole state's cells list their sequences, a sequence state's
    /// cells (from a whole state: call `extract` first) one; cell extensions take the format's
    /// width (a 12-byte extension's token from `tokens` by position, else LLAMA_TOKEN_NULL).
    pub fn to_format(&mut self, format: Format, tokens: Option<&[i32]>) -> Result<()> {
        if self.format.device {
            // the rows are in llama.cpp's buffers: only the raw sequence bytes that name them
            if format.container != Container::RawSeq || !format.io_magic {
                return Err(WriteError::request(
                    "container",
                    "a state written with LLAMA_STATE_SEQ_FLAGS_ON_DEVICE holds no row (llama.cpp \
                     kept them in its own buffers): it is written only as raw sequence bytes",
                ));
            }
        }
        let format = Format {
            device: self.format.device,
            ..format
        };
        if !format.is_sequence() {
            if self.arch.is_none() {
                return Err(WriteError::request(
                    "arch",
                    "a whole state starts with the model's architecture name, and this sequence \
                     state has none: open it with model= or pass arch= (--model / --arch on the \
                     command line)",
                ));
            }
            if let Some(a) = self.arch.as_deref().filter(|a| !is_arch_name(a.as_bytes())) {
                return Err(WriteError::request(
                    "arch",
                    format!(
                        "an architecture name of 1 to {MAX_ARCH_LEN} characters of A-Z, a-z, 0-9, \
                         '_', '.' and '-' (a model's general.architecture), not {:?}: neither \
                         llama.cpp nor kvfast reads a state that starts with another",
                        a
                    ),
                ));
            }
            // cells listing no sequence are a sequence state's (the recurrent part's, or a 2025
            // build's): a whole state lists it
            let q = self.own_seq().unwrap_or(0);
            self.own(q);
        } else {
            check::one_sequence(self)?;
            if let Some((ci, _, i)) = self.shared_cell() {
                return Err(err(
                    format!("cache {ci} cell {i} seq_id"),
                    "seq_id",
                    "one sequence per cell in a sequence state: choose one with seq_id=",
                    "several sequences",
                ));
            }
            // a per-sequence save lists the sequence in each attention cell (none before mid-2025,
            // when caches had no n_stream) and none in the recurrent part's cell
            let q = self.own_seq().unwrap_or(0);
            for c in &mut self.caches {
                let recurrent = c.memory.is_recurrent();
                for cell in c.streams.iter_mut().flat_map(|s| &mut s.cells) {
                    if recurrent || !format.n_stream {
                        cell.seqs.clear();
                    } else if cell.seqs.is_empty() {
                        cell.seqs.push(q);
                    }
                }
            }
        }
        check::guarantees(self, format.is_sequence())?;
        if format.container == Container::RawSeq && format.io_magic && self.seq_id.is_none() {
            self.seq_id = Some(self.own_seq().unwrap_or(0));
        }
        let width = format.ext_bytes as usize / 4;
        for c in &mut self.caches {
            if c.memory.is_recurrent() {
                continue;
            }
            if !format.n_stream && c.streams.len() != 1 {
                return Err(err(
                    "n_stream",
                    "container",
                    "one stream (the target format has no n_stream field)",
                    c.streams.len(),
                ));
            }
            for s in &mut c.streams {
                for cell in &mut s.cells {
                    if cell.ext.is_empty() || cell.ext.len() == width {
                        continue;
                    }
                    if cell.ext.len() > width {
                        cell.ext.truncate(width);
                    } else {
                        let tok = tokens
                            .and_then(|t| t.get(cell.pos as usize).copied())
                            .unwrap_or(TOKEN_NULL);
                        cell.ext.resize(width, tok);
                    }
                }
            }
        }
        if format.outputs && self.outputs.is_none() {
            return Err(err(
                "outputs",
                "version",
                "the outputs block of the source (only a 2025 state has one to write)",
                "none",
            ));
        }
        if !format.outputs {
            self.outputs = None;
        }
        if matches!(format.container, Container::RawSeq | Container::RawState) {
            self.token_words = None;
        } else if self.token_words.is_none() {
            self.token_words = Some(Vec::new());
        }
        self.format = format;
        Ok(())
    }

    /// The one sequence of a sequence state: the io header's, else the one its cells list.
    pub fn own_seq(&self) -> Option<i32> {
        self.seq_id.or_else(|| {
            self.caches
                .iter()
                .flat_map(|c| &c.streams)
                .flat_map(|s| &s.cells)
                .find_map(|c| c.seqs.first().copied())
        })
    }

    /// A cell of an attention cache listing more than one sequence: (cache, stream offset, cell).
    fn shared_cell(&self) -> Option<(usize, u64, usize)> {
        for (ci, c) in self.caches.iter().enumerate() {
            for s in &c.streams {
                if let Some(i) = s.cells.iter().position(|cell| cell.seqs.len() > 1) {
                    return Some((ci, s.at, i));
                }
            }
        }
        None
    }
}

/// Join states into one: the cells of each stream of each cache one state after the other, with
/// their rows. The caches must agree (count, memory, streams, layers, types and widths), and no
/// sequence may be in two states.
pub fn concat(parts: Vec<StateParts>, share: bool) -> Result<StateParts> {
    let mut it = parts.into_iter();
    let mut out = it
        .next()
        .ok_or_else(|| err("states", "source", "at least one state", 0))?;
    if let Some(seq) = out.own_seq() {
        out.own(seq);
    }
    for (n, mut p) in it.enumerate() {
        let n = n + 1;
        if let Some(seq) = p.own_seq() {
            p.own(seq);
        }
        let mine = seqs_of(&out);
        if let Some(q) = seqs_of(&p).into_iter().find(|q| mine.contains(q)) {
            return Err(err(
                format!("state {n} seq_id"),
                "seq_id",
                "sequences no earlier state holds (rename them with seq_id=)",
                q,
            ));
        }
        if p.caches.len() != out.caches.len() {
            return Err(err(
                format!("state {n} caches"),
                "source",
                format!("{} caches as state 0", out.caches.len()),
                p.caches.len(),
            ));
        }
        for (ci, (a, b)) in out.caches.iter_mut().zip(p.caches).enumerate() {
            join_cache(n, ci, a, b, share)?;
        }
        if let (Some(a), Some(b)) = (&mut out.token_words, p.token_words) {
            a.extend(b);
        }
    }
    out.seq_id = None;
    Ok(out)
}

fn join_cache(n: usize, ci: usize, a: &mut CacheParts, b: CacheParts, share: bool) -> Result<()> {
    let at = format!("state {n} cache {ci}");
    if a.memory != b.memory || a.streams.len() != b.streams.len() {
        return Err(err(
            at,
            "source",
            format!(
                "a {} cache of {} streams as in state 0",
                a.memory.name(),
                a.streams.len()
            ),
            format!("a {} cache of {} streams", b.memory.name(), b.streams.len()),
        ));
    }
    let recurrent = b.memory.is_recurrent();
    for (si, (x, mut y)) in a.streams.iter_mut().zip(b.streams).enumerate() {
        if y.cells.is_empty() && !b.memory.is_recurrent() {
            continue;
        }
        if x.cells.is_empty() && !a.memory.is_recurrent() {
            *x = y;
            continue;
        }
        let at = format!("state {n} cache {ci} stream {si}");
        if x.v_trans != y.v_trans || x.layers.len() != y.layers.len() {
            return Err(err(
                format!("{at} layers"),
                "source",
                format!(
                    "{} layers, v_trans {} as in state 0",
                    x.layers.len(),
                    x.v_trans as u8
                ),
                format!("{} layers, v_trans {}", y.layers.len(), y.v_trans as u8),
            ));
        }
        for (li, (l, m)) in x.layers.iter().zip(&y.layers).enumerate() {
            rows_agree(&at, li, &l.0, &m.0)?;
            match (&l.1, &m.1) {
                (Some(v), Some(w)) => rows_agree(&at, li, v, w)?,
                (None, None) => {}
                _ => {
                    return Err(err(
                        format!("{at} layer {li} v"),
                        "source",
                        "V records in both or neither",
                        "one",
                    ))
                }
            }
        }
        if share && !recurrent {
            shared_into(x, &mut y);
        }
        for (l, m) in x.layers.iter_mut().zip(y.layers) {
            l.0.append(m.0);
            if let (Some(v), Some(w)) = (&mut l.1, m.1) {
                v.append(w);
            }
        }
        x.cells.extend(y.cells);
    }
    Ok(())
}

fn rows_agree(at: &str, li: usize, a: &Rows, b: &Rows) -> Result<()> {
    if a.ty != b.ty || a.n_embd != b.n_embd {
        return Err(err(
            format!("{at} layer {li} {}", b.kind),
            "source",
            format!("{} rows of {} values as in state 0", a.ty, a.n_embd),
            format!("{} rows of {} values", b.ty, b.n_embd),
        ));
    }
    Ok(())
}

/// Cells of `y` that are a cell of `x` (the same position, extension and rows in every record,
/// as a prefix llama.cpp decoded once and copied to several sequences is) become that cell, which
/// lists their sequences too; they leave `y`.
fn shared_into(x: &mut StreamParts, y: &mut StreamParts) {
    let mut by_pos: std::collections::HashMap<i32, Vec<usize>> = std::collections::HashMap::new();
    for (i, c) in x.cells.iter().enumerate() {
        by_pos.entry(c.pos).or_default().push(i);
    }
    let same = |i: usize, j: usize| {
        x.cells[i].ext == y.cells[j].ext
            && x.layers.iter().zip(&y.layers).all(|(l, m)| {
                l.0.row(i) == m.0.row(j)
                    && match (&l.1, &m.1) {
                        (Some(v), Some(w)) => v.row(i) == w.row(j),
                        _ => true,
                    }
            })
    };
    let mut keep = vec![true; y.cells.len()];
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (j, k) in keep.iter_mut().enumerate() {
        let found = by_pos
            .get(&y.cells[j].pos)
            .and_then(|is| is.iter().copied().find(|&i| same(i, j)));
        if let Some(i) = found {
            merged.push((i, j));
            *k = false;
        }
    }
    for (i, j) in merged {
        let mut seqs = x.cells[i].seqs.clone();
        seqs.extend(&y.cells[j].seqs);
        seqs.sort_unstable();
        seqs.dedup();
        x.cells[i].seqs = seqs;
    }
    let mut it = keep.iter();
    y.cells.retain(|_| *it.next().unwrap_or(&true));
    for (k, v) in &mut y.layers {
        k.keep(&keep);
        if let Some(v) = v {
            v.keep(&keep);
        }
    }
}

/// Whether a cache is an attention cache (K and V) rather than the recurrent part.
pub fn is_attention(c: &CacheParts) -> bool {
    c.memory == Memory::Attention
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::parts::{Cell, Format};

    fn rows(kind: Kind, ty: GgmlType, n: u64, cells: usize) -> Rows {
        let vals: Vec<f32> = (0..n as usize * cells)
            .map(|i| (i % 17) as f32 - 8.0)
            .collect();
        let mut r = Rows::from_bytes(kind, GgmlType::F32, n, vec![], 0);
        r.store(ty, &vals, 0).unwrap();
        r
    }

    fn parts(seqs: &[&[i32]]) -> StateParts {
        let cells: Vec<Cell> = seqs
            .iter()
            .enumerate()
            .map(|(i, s)| Cell {
                pos: i as i32,
                seqs: s.to_vec(),
                ext: vec![],
            })
            .collect();
        let n = cells.len();
        StateParts {
            format: Format::newest(Container::RawState),
            seq_id: None,
            token_words: None,
            arch: Some("qwen3".into()),
            outputs: None,
            caches: vec![CacheParts {
                memory: Memory::Attention,
                at: 0,
                streams: vec![StreamParts {
                    cells,
                    v_trans: false,
                    layers: vec![(
                        rows(Kind::K, GgmlType::F16, 64, n),
                        Some(rows(Kind::V, GgmlType::F16, 64, n)),
                    )],
                    at: 0,
                }],
            }],
        }
    }

    #[test]
    fn keep_drops_cells_and_rows_together() {
        let mut p = parts(&[&[0], &[0, 1], &[1]]);
        let before = p.caches[0].streams[0].layers[0].0.row(2).to_vec();
        p.keep(&[vec![vec![true, false, true]]]).unwrap();
        let s = &p.caches[0].streams[0];
        assert_eq!(
            s.cells.iter().map(|c| c.pos).collect::<Vec<_>>(),
            vec![0, 2]
        );
        assert_eq!(&*s.layers[0].0.row(1), &before[..]);
        assert_eq!(s.layers[0].1.as_ref().unwrap().byte_len(), 2 * 128);
        assert!(p.keep(&[vec![vec![true]]]).is_err());
    }

    #[test]
    fn extract_rename_and_concat() {
        let mut a = parts(&[&[0], &[0, 1], &[1]]);
        assert!(a
            .clone()
            .to_format(Format::newest(Container::Ggsq), None)
            .is_err());
        a.extract(1).unwrap();
        assert_eq!(a.caches[0].streams[0].cells.len(), 2);
        a.to_format(Format::newest(Container::Ggsq), None).unwrap();
        let b = a.clone();
        assert!(concat(vec![a.clone(), b.clone()], false).is_err()); // sequence 1 in both
        let mut b = b;
        b.rename(&[(1, 4)]).unwrap();
        let mut j = concat(vec![a, b], false).unwrap();
        j.to_format(Format::newest(Container::RawState), None)
            .unwrap();
        let s = &j.caches[0].streams[0];
        assert_eq!(s.cells.len(), 4);
        assert_eq!(s.cells[3].seqs, vec![4]);
        assert_eq!(s.layers[0].0.byte_len(), 4 * 128);
        assert!(j.rename(&[(1, 4)]).is_err()); // two sequences of one name
    }

    #[test]
    fn retype_round_trips_through_the_rotation() {
        let mut p = parts(&[&[0], &[0]]);
        let f16 = p.caches[0].streams[0].layers[0].0.values(0);
        p.retype(Retype {
            cache: 0,
            kind: Kind::K,
            ty: GgmlType::Q8_0,
            from_group: 0,
            to_group: 64,
        })
        .unwrap();
        let k = &p.caches[0].streams[0].layers[0].0;
        assert_eq!((k.ty, k.byte_len()), (GgmlType::Q8_0, 2 * 68));
        let back = k.values(64);
        let err: f32 = f16.iter().zip(&back).map(|(a, b)| (a - b).powi(2)).sum();
        let norm: f32 = f16.iter().map(|a| a * a).sum();
        assert!((err / norm).sqrt() < 0.02, "{}", (err / norm).sqrt());
        // stored rotated: not the values themselves
        assert!(k
            .values(0)
            .iter()
            .zip(&f16)
            .any(|(a, b)| (a - b).abs() > 0.5));
    }

    /// The field of a request the edit refuses (panics on anything else).
    fn refused<T: std::fmt::Debug>(r: Result<T>) -> String {
        match r {
            Err(WriteError::Request { field, .. }) => field,
            other => panic!("expected a refused request, got {other:?}"),
        }
    }

    #[test]
    fn written_states_mean_what_llama_cpp_loads() {
        // a sequence state of cells of two sequences: refused (llama.cpp makes them one)
        let two = parts(&[&[0], &[1]]);
        let e = two.clone().to_format(Format::newest(Container::Ggsq), None);
        assert_eq!(refused(e), "container");
        // a 2025 sequence state (cells list none) takes the sequence it is renamed to
        let mut old = parts(&[&[], &[]]);
        old.format = Format::newest(Container::Ggsq);
        old.own_sequence();
        old.rename(&[(0, 3)]).unwrap();
        let mut whole = old.clone();
        whole
            .to_format(Format::newest(Container::RawState), None)
            .unwrap();
        assert_eq!(seqs_of(&whole), vec![3]);
        // and lists none again as a sequence state of a build without n_stream
        let mut f = Format::newest(Container::Ggsq);
        f.n_stream = false;
        old.to_format(f, None).unwrap();
        assert!(old.caches[0].streams[0]
            .cells
            .iter()
            .all(|c| c.seqs.is_empty()));
        // one sequence may hold a position twice (M-RoPE, seq_div): renaming keeps both cells
        let mut dup = parts(&[&[0], &[0]]);
        dup.caches[0].streams[0].cells[1].pos = 0;
        dup.rename(&[(0, 2)]).unwrap();
        // two sequences renamed to one must not meet at a position
        let mut meet = parts(&[&[0], &[1]]);
        meet.caches[0].streams[0].cells[1].pos = 0;
        assert_eq!(refused(meet.rename(&[(1, 0)])), "seq_id");
        // an empty cache before one that holds cells: not what llama.cpp writes
        let mut pair = parts(&[&[0], &[0]]);
        pair.caches.push(pair.caches[0].clone());
        pair.keep(&[vec![vec![false, false]], vec![]]).unwrap();
        let e = pair.to_format(Format::newest(Container::RawState), None);
        assert_eq!(refused(e), "keep");
        // two recurrent cells of one sequence: llama.cpp's "duplicate tail"
        let mut rec = parts(&[&[0], &[0]]);
        rec.caches[0].memory = Memory::Recurrent { n_layer: 1 };
        let e = rec.to_format(Format::newest(Container::RawState), None);
        assert_eq!(refused(e), "seq_id");
    }

    #[test]
    fn bad_requests_are_write_errors_naming_the_argument() {
        let a = parts(&[&[1], &[1]]);
        assert_eq!(refused(concat(vec![a.clone(), a.clone()], false)), "seq_id");
        let mut p = a.clone();
        assert_eq!(refused(p.rename(&[(1, 256)])), "seq_id");
        assert_eq!(refused(p.extract(7)), "seq_id");
        assert_eq!(refused(p.keep(&[vec![vec![true]]])), "keep");
        p.set_v_trans(true).unwrap();
        let q8 = Retype {
            cache: 0,
            kind: Kind::V,
            ty: GgmlType::Q8_0,
            from_group: 0,
            to_group: 0,
        };
        assert_eq!(refused(p.retype(q8)), "cache_type_v");
        assert_eq!(
            p.extract(7).unwrap_err().to_string(),
            "seq_id: the state holds sequences [1], not 7"
        );
        p.arch = None;
        let e = p.to_format(Format::newest(Container::RawState), None);
        assert_eq!(refused(e), "arch");
    }
}
