//! A pass of attention over an opened state: each query's weights over the cells it may see in
//! each attention layer, handed out as a table or reduced without keeping them.
//!
//! Layers are taken one at a time: a layer's keys (every stream of its cache) are decoded once
//! into f32 in the model's basis, then the queries are split into chunks computed in parallel,
//! each query's logits over its cells kept only while its heads are reduced. Memory: one layer's
//! keys, a chunk's output, and (for the mass per cell) one heads x cells accumulator per thread.

use std::collections::HashMap;

use rayon::prelude::*;

use crate::attention::finite;
use crate::attention::kernel::{block_logits, entropy, softmax, top_k, Keys, Seen};
use crate::attention::params::LayerAttn;
use crate::attention::AttnError;
use crate::format::layout::Kind;
use crate::open::Opened;
use crate::plan::columns::{Table, Values};
use crate::plan::select::jobs;

/// Where one model layer's query heads lie in a query row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub model_layer: u32,
    /// First value of the block in the row.
    pub offset: usize,
    pub n_head: usize,
    pub head_dim: usize,
}

/// Query vectors: a row per query token (its position and sequence), each the concatenation of
/// its layers' blocks, each block head-major (`n_head` heads of `head_dim` values).
#[derive(Clone, Copy)]
pub struct Queries<'a> {
    pub values: &'a [f32],
    pub row_len: usize,
    pub pos: &'a [i32],
    pub seq: &'a [i32],
    pub blocks: &'a [Block],
}

/// What a pass hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    /// A row per (layer, head, query, cell seen): the weight.
    Weights,
    /// A row per (layer, head, cell): the attention mass it received (summed over the queries),
    /// and how many queries saw it.
    Mass,
    /// A row per (layer, head, query): the entropy of its weights, the cells seen, the largest.
    Entropy,
    /// A row per (layer, head, query, rank): the `k` cells of largest weight.
    TopK(usize),
}

/// What to do with a query that sees fewer cells than it saw in llama.cpp (a sliding-window
/// cache of a sequence save keeps only the last window's cells).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incomplete {
    Error,
    Skip,
}

/// A pass's inputs.
pub struct Request<'a> {
    pub opened: &'a Opened,
    /// The model's attention layers (with any scale or sinks given in place of its own).
    pub layers: &'a [LayerAttn],
    pub queries: Queries<'a>,
    /// The model layers to compute (None: every layer the queries have).
    pub model_layers: Option<&'a [u32]>,
    /// The query heads (None: all).
    pub heads: Option<&'a [u32]>,
    pub incomplete: Incomplete,
    /// Queries per parallel chunk.
    pub chunk: usize,
}

/// Queries whose logits are computed together, each K row read once for all of them.
pub(super) const BLOCK: usize = 8;

fn queries_err(field: &'static str, message: String) -> AttnError {
    AttnError::Queries { field, message }
}

/// One cache layer to compute: where it is, its model layer's attention and query block.
pub(super) struct Task<'a> {
    pub(super) cache: u32,
    pub(super) layer: u32,
    pub(super) attn: &'a LayerAttn,
    pub(super) block: Block,
    pub(super) heads: Vec<usize>,
}

impl Request<'_> {
    pub(super) fn check(&self) -> Result<(), AttnError> {
        let q = &self.queries;
        let n = q.pos.len();
        if q.seq.len() != n {
            return Err(queries_err(
                "queries",
                format!("{n} positions but {} sequence ids", q.seq.len()),
            ));
        }
        if n.checked_mul(q.row_len) != Some(q.values.len()) {
            return Err(queries_err(
                "queries",
                format!(
                    "{} values are not {n} rows of {} values",
                    q.values.len(),
                    q.row_len
                ),
            ));
        }
        if let Some(s) = q.seq.iter().find(|s| !(0..256).contains(*s)) {
            return Err(queries_err(
                "queries",
                format!("sequence id {s}: expected 0 to 255"),
            ));
        }
        for b in q.blocks {
            let end = b
                .n_head
                .checked_mul(b.head_dim)
                .and_then(|w| w.checked_add(b.offset));
            if end.is_none_or(|e| e > q.row_len) {
                return Err(queries_err(
                    "queries",
                    format!(
                        "model layer {}: {} heads of {} values at value {} do not fit rows of {}",
                        b.model_layer, b.n_head, b.head_dim, b.offset, q.row_len
                    ),
                ));
            }
        }
        if !self.opened.rope.is_empty() {
            return Err(queries_err(
                "state",
                "the state gives keys before RoPE (pre_rope=True): queries pair with keys after \
                 RoPE; open it without pre_rope"
                    .into(),
            ));
        }
        if self.chunk == 0 {
            return Err(queries_err("chunk", "chunk must be positive".into()));
        }
        Ok(())
    }

    pub(super) fn tasks(&self) -> Result<Vec<Task<'_>>, AttnError> {
        let layout = &self.opened.state.layout;
        let map = &self.opened.model_layers;
        let mut out = vec![];
        for (ci, cache) in layout.caches.iter().enumerate() {
            if cache.memory.is_recurrent() {
                continue;
            }
            let n_layers = cache
                .streams
                .iter()
                .map(|s| s.layers.len())
                .max()
                .unwrap_or(0);
            if n_layers == 0 {
                continue;
            }
            let Some(Some(layers)) = map.get(ci) else {
                return Err(queries_err(
                    "model",
                    format!("the model layer of cache {ci}'s layers is not known: give the model"),
                ));
            };
            for (li, &ml) in layers.iter().enumerate() {
                let ml = ml as u32;
                if self.model_layers.is_some_and(|s| !s.contains(&ml)) {
                    continue;
                }
                let Some(block) = self.queries.blocks.iter().find(|b| b.model_layer == ml) else {
                    continue;
                };
                let Some(attn) = self.layers.iter().find(|l| l.model_layer == ml) else {
                    return Err(queries_err(
                        "model",
                        format!(
                            "model layer {ml} is in cache {ci} but the model gives it no attention"
                        ),
                    ));
                };
                if (block.n_head, block.head_dim) != (attn.n_head, attn.head_dim) {
                    return Err(queries_err(
                        "model",
                        format!(
                            "model layer {ml}: the queries have {} heads of {} values, the model \
                             {} of {}",
                            block.n_head, block.head_dim, attn.n_head, attn.head_dim
                        ),
                    ));
                }
                if let Some(s) = &attn.sinks {
                    if s.len() != attn.n_head {
                        return Err(queries_err(
                            "sinks",
                            format!(
                                "model layer {ml}: {} sinks for {} heads",
                                s.len(),
                                attn.n_head
                            ),
                        ));
                    }
                }
                let heads: Vec<usize> = match self.heads {
                    None => (0..attn.n_head).collect(),
                    Some(hs) => {
                        if let Some(h) = hs.iter().find(|h| **h as usize >= attn.n_head) {
                            return Err(queries_err(
                                "heads",
                                format!(
                                    "head {h} out of range: model layer {ml} has {} query heads",
                                    attn.n_head
                                ),
                            ));
                        }
                        if let Some(h) = hs
                            .iter()
                            .enumerate()
                            .find_map(|(i, h)| hs[..i].contains(h).then_some(h))
                        {
                            return Err(queries_err(
                                "heads",
                                format!("head {h} is asked twice: give each head once"),
                            ));
                        }
                        hs.iter().map(|h| *h as usize).collect()
                    }
                };
                let q = &self.queries;
                let rows = finite::Rows {
                    values: q.values,
                    row_len: q.row_len,
                    pos: q.pos,
                    seq: q.seq,
                };
                finite::check(rows, block.offset, block.head_dim, &heads, attn)?;
                out.push(Task {
                    cache: ci as u32,
                    layer: li as u32,
                    attn,
                    block: *block,
                    heads,
                });
            }
        }
        if let Some(asked) = self.model_layers {
            for ml in asked {
                if !out.iter().any(|t| t.attn.model_layer == *ml) {
                    return Err(queries_err(
                        "layers",
                        format!(
                            "model layer {ml}: no attention layer of the state has queries for it"
                        ),
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Decode a task's keys, every stream of its cache.
    pub(super) fn keys(&self, t: &Task) -> Result<Keys<'_>, AttnError> {
        let op = self.opened;
        let sel = op.selection(
            Some(vec![t.cache]),
            Some(vec![t.layer]),
            vec![Kind::K],
            None,
        );
        let n_embd = t.attn.n_head_kv * t.attn.head_dim;
        let mut keys = Keys {
            rows: vec![],
            streams: vec![],
            n_embd,
        };
        for job in jobs(&op.state.layout, &sel)? {
            if job.rec.n_embd as usize != n_embd {
                return Err(queries_err(
                    "model",
                    format!(
                        "cache {} layer {} (model layer {}): K rows of {} values, the model has {} \
                         KV heads of {}",
                        t.cache,
                        t.layer,
                        t.attn.model_layer,
                        job.rec.n_embd,
                        t.attn.n_head_kv,
                        t.attn.head_dim
                    ),
                ));
            }
            let view = op.state.view(&job)?;
            let cells = job.stream.cell_count as usize;
            let mut rows = vec![0f32; cells * n_embd];
            let step = view.chunk_cells();
            for c0 in (0..cells).step_by(step) {
                let c1 = (c0 + step).min(cells);
                view.decode(c0, c1, &mut rows[c0 * n_embd..c1 * n_embd]);
            }
            keys.rows.push(rows);
            keys.streams.push(job.stream);
        }
        Ok(keys)
    }
}

/// Per sequence, every position any attention cache holds a cell of (sorted, once each): what a
/// query saw, for the check that a cache holds all of it.
pub(super) fn positions(op: &Opened) -> HashMap<i32, Vec<i32>> {
    let own = op.state.layout.own_seq();
    let mut out: HashMap<i32, Vec<i32>> = HashMap::new();
    for cache in op.state.layout.attention() {
        for s in &cache.streams {
            for c in 0..s.cell_count as usize {
                let seqs = s.cell_seqs(c);
                if seqs.is_empty() {
                    if let Some(q) = own {
                        out.entry(q).or_default().push(s.pos[c]);
                    }
                }
                for q in seqs {
                    out.entry(*q).or_default().push(s.pos[c]);
                }
            }
        }
    }
    for v in out.values_mut() {
        v.sort_unstable();
        v.dedup();
    }
    out
}

/// The output columns of a pass (those of its reduction filled).
#[derive(Default)]
struct Rows {
    cache: Vec<u8>,
    stream: Vec<u8>,
    layer: Vec<u16>,
    model_layer: Vec<u16>,
    head: Vec<u16>,
    query_pos: Vec<i32>,
    seq: Vec<u8>,
    rank: Vec<u16>,
    cell: Vec<u32>,
    pos: Vec<i32>,
    weight: Vec<f64>,
    cells: Vec<u32>,
    queries: Vec<u32>,
}

impl Rows {
    fn append(&mut self, mut o: Rows) {
        self.cache.append(&mut o.cache);
        self.stream.append(&mut o.stream);
        self.layer.append(&mut o.layer);
        self.model_layer.append(&mut o.model_layer);
        self.head.append(&mut o.head);
        self.query_pos.append(&mut o.query_pos);
        self.seq.append(&mut o.seq);
        self.rank.append(&mut o.rank);
        self.cell.append(&mut o.cell);
        self.pos.append(&mut o.pos);
        self.weight.append(&mut o.weight);
        self.cells.append(&mut o.cells);
        self.queries.append(&mut o.queries);
    }

    fn key(&mut self, t: &Task, head: usize, n: usize) {
        self.cache.extend(std::iter::repeat_n(t.cache as u8, n));
        self.layer.extend(std::iter::repeat_n(t.layer as u16, n));
        self.model_layer
            .extend(std::iter::repeat_n(t.attn.model_layer as u16, n));
        self.head.extend(std::iter::repeat_n(head as u16, n));
    }

    fn table(self, what: Reduce) -> Table {
        let mut t = Table::default();
        t.push("cache", Values::U8(self.cache));
        if !matches!(what, Reduce::Entropy) {
            t.push("stream", Values::U8(self.stream));
        }
        t.push("layer", Values::U16(self.layer));
        t.push("model_layer", Values::U16(self.model_layer));
        t.push("head", Values::U16(self.head));
        if !matches!(what, Reduce::Mass) {
            t.push("query_pos", Values::I32(self.query_pos));
            t.push("seq_id", Values::U8(self.seq));
        }
        match what {
            Reduce::Weights | Reduce::TopK(_) => {
                if matches!(what, Reduce::TopK(_)) {
                    t.push("rank", Values::U16(self.rank));
                }
                t.push("cell", Values::U32(self.cell));
                t.push("pos", Values::I32(self.pos));
                t.push("weight", Values::F64(self.weight));
            }
            Reduce::Mass => {
                t.push("cell", Values::U32(self.cell));
                t.push("pos", Values::I32(self.pos));
                t.push("mass", Values::F64(self.weight));
                t.push("queries", Values::U32(self.queries));
            }
            Reduce::Entropy => {
                t.push("entropy", Values::F64(self.weight));
                t.push("cells", Values::U32(self.cells));
            }
        }
        t
    }
}

/// One task's inputs, as every chunk of its queries reads them.
pub(super) struct Ctx<'a> {
    pub(super) req: &'a Request<'a>,
    pub(super) t: &'a Task<'a>,
    pub(super) keys: &'a Keys<'a>,
    /// Per sequence, the positions the state holds (see [`positions`]).
    pub(super) held: &'a HashMap<i32, Vec<i32>>,
    /// Per stream, the index of its first cell in a row of every stream's cells (and the total).
    pub(super) starts: &'a [usize],
}

/// The cells query `r` sees in a task's cache (in stream, then cell order), checked against what
/// its sequence holds.
pub(super) fn seen(x: &Ctx, r: usize, out: &mut Vec<Seen>) -> Result<bool, AttnError> {
    let (req, t, keys, held) = (x.req, x.t, x.keys, x.held);
    let (p1, sq) = (req.queries.pos[r], req.queries.seq[r]);
    let own = req.opened.state.layout.own_seq();
    let w = t.attn.window;
    out.clear();
    for (si, s) in keys.streams.iter().enumerate() {
        for c in 0..s.cell_count as usize {
            let p0 = s.pos[c];
            if p0 > p1 || w.masks(p0, p1) {
                continue;
            }
            let seqs = s.cell_seqs(c);
            let mine = if seqs.is_empty() {
                own.is_none_or(|o| o == sq)
            } else {
                seqs.contains(&sq)
            };
            if mine {
                out.push((si as u32, c as u32));
            }
        }
    }
    let expected = held.get(&sq).map_or(0, |ps| {
        ps.iter()
            .filter(|p0| **p0 <= p1 && !w.masks(**p0, p1))
            .count()
    });
    if out.len() >= expected && !out.is_empty() {
        return Ok(true);
    }
    match req.incomplete {
        Incomplete::Skip => Ok(false),
        Incomplete::Error => Err(AttnError::Incomplete(if expected == 0 {
            format!(
                "cache {} layer {} (model layer {}): the query of sequence {sq} at position {p1} \
                 sees no cell of the state",
                t.cache, t.layer, t.attn.model_layer
            )
        } else {
            format!(
                "cache {} layer {} (model layer {}): the query of sequence {sq} at position {p1} \
                 saw {expected} cells in llama.cpp, the cache holds {} of them (a sequence save \
                 keeps only the sliding window of its last position: use a whole-context state, \
                 or incomplete='skip')",
                t.cache,
                t.layer,
                t.attn.model_layer,
                out.len()
            )
        })),
    }
}

/// A query head's rows of the cells `ix` (indices into its `cells` and weights `w`), with their
/// rank where `rank`.
#[allow(clippy::too_many_arguments)]
fn emit(
    rows: &mut Rows,
    t: &Task,
    keys: &Keys,
    (h, p1, sq): (usize, i32, u8),
    cells: &[Seen],
    w: &[f64],
    ix: &[usize],
    rank: bool,
) {
    rows.key(t, h, ix.len());
    rows.query_pos.extend(std::iter::repeat_n(p1, ix.len()));
    rows.seq.extend(std::iter::repeat_n(sq, ix.len()));
    for (k, &j) in ix.iter().enumerate() {
        let (s, c) = cells[j];
        rows.stream.push(keys.streams[s as usize].index as u8);
        rows.cell.push(c);
        rows.pos.push(keys.streams[s as usize].pos[c as usize]);
        rows.weight.push(w[j]);
        if rank {
            rows.rank.push(k as u16);
        }
    }
}

/// One chunk of queries of a task: rows of each reduction asked (in the order of `whats`), from
/// one computation of each query head's weights, and (for the mass) its sums per head and cell
/// (cells of every stream in a row).
fn chunk(
    x: &Ctx,
    qs: std::ops::Range<usize>,
    whats: &[Reduce],
    mass: &mut [(f64, u32)],
) -> Result<Vec<Rows>, AttnError> {
    let (req, t, keys, starts) = (x.req, x.t, x.keys, x.starts);
    let q = &req.queries;
    let d = t.attn.head_dim;
    let mut out: Vec<Rows> = whats.iter().map(|_| Rows::default()).collect();
    let mut w: Vec<f64> = vec![];
    let mut lg: Vec<f64> = vec![];
    let n_cells = *starts.last().unwrap_or(&0);
    let all: Vec<usize> = qs.collect();
    for block in all.chunks(BLOCK) {
        // the queries of the block that see their cells, and the union of those cells
        let mut lists: Vec<(usize, Vec<Seen>)> = vec![];
        for &r in block {
            let mut cells = vec![];
            if seen(x, r, &mut cells)? {
                lists.push((r, cells));
            }
        }
        let mut union: Vec<Seen> = lists.iter().flat_map(|(_, l)| l.iter().copied()).collect();
        union.sort_unstable();
        union.dedup();
        // where each query's cells lie in the union: both sorted (by stream, then cell), so one
        // walk along the union
        let at: Vec<Vec<usize>> = lists
            .iter()
            .map(|(_, l)| {
                let mut u = 0;
                l.iter()
                    .map(|sc| {
                        while union[u] != *sc {
                            u += 1;
                        }
                        u
                    })
                    .collect()
            })
            .collect();
        let nu = union.len();
        for (hi, &h) in t.heads.iter().enumerate() {
            let qv: Vec<&[f32]> = lists
                .iter()
                .map(|(r, _)| {
                    let o = r * q.row_len + t.block.offset + h * d;
                    &q.values[o..o + d]
                })
                .collect();
            block_logits(t.attn, keys, h, &qv, &union, &mut lg);
            for (i, (r, cells)) in lists.iter().enumerate() {
                let (p1, sq) = (q.pos[*r], q.seq[*r] as u8);
                w.clear();
                w.extend(at[i].iter().map(|u| lg[i * nu + u]));
                softmax(&mut w, t.attn.sinks.as_ref().map(|s| s[h]));
                for (rows, what) in out.iter_mut().zip(whats) {
                    match *what {
                        Reduce::Weights => {
                            let ix: Vec<usize> = (0..w.len()).collect();
                            emit(rows, t, keys, (h, p1, sq), cells, &w, &ix, false);
                        }
                        Reduce::TopK(k) => {
                            emit(rows, t, keys, (h, p1, sq), cells, &w, &top_k(&w, k), true)
                        }
                        Reduce::Entropy => {
                            rows.key(t, h, 1);
                            rows.query_pos.push(p1);
                            rows.seq.push(sq);
                            rows.weight.push(entropy(&w));
                            rows.cells.push(w.len() as u32);
                        }
                        Reduce::Mass => {
                            let acc = &mut mass[hi * n_cells..(hi + 1) * n_cells];
                            for (&(s, c), x) in cells.iter().zip(&w) {
                                let e = &mut acc[starts[s as usize] + c as usize];
                                e.0 += x;
                                e.1 += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

/// A task's mass rows from its sums per head and cell: a row per cell some query saw.
fn mass_rows(t: &Task, keys: &Keys, starts: &[usize], mass: &[(f64, u32)]) -> Rows {
    let n_cells = *starts.last().unwrap_or(&0);
    let mut m = Rows::default();
    for (hi, &h) in t.heads.iter().enumerate() {
        for (si, s) in keys.streams.iter().enumerate() {
            for c in 0..s.cell_count as usize {
                let (sum, k) = mass[hi * n_cells + starts[si] + c];
                if k == 0 {
                    continue;
                }
                m.key(t, h, 1);
                m.stream.push(s.index as u8);
                m.cell.push(c as u32);
                m.pos.push(s.pos[c]);
                m.weight.push(sum);
                m.queries.push(k);
            }
        }
    }
    m
}

/// Run a pass: one table per computed cache layer, in cache and layer order (a pass of nothing
/// to compute gives one table of no rows).
pub fn run(req: &Request, what: Reduce) -> Result<Vec<Table>, AttnError> {
    let mut out = run_many(req, &[what])?;
    Ok(out.pop().unwrap_or_default())
}

/// Run one pass for several reductions: for each of `whats` (in order) the tables of [`run`],
/// each query head's weights computed once for all of them.
pub fn run_many(req: &Request, whats: &[Reduce]) -> Result<Vec<Vec<Table>>, AttnError> {
    req.check()?;
    let tasks = req.tasks()?;
    let held = positions(req.opened);
    let n = req.queries.pos.len();
    let mut out: Vec<Vec<Table>> = whats.iter().map(|_| vec![]).collect();
    let want_mass = whats.contains(&Reduce::Mass);
    for t in &tasks {
        let keys = req.keys(t)?;
        let mut starts = vec![0usize];
        for s in &keys.streams {
            starts.push(starts.last().unwrap() + s.cell_count as usize);
        }
        let n_cells = *starts.last().unwrap();
        let ctx = Ctx {
            req,
            t,
            keys: &keys,
            held: &held,
            starts: &starts,
        };
        let width = if want_mass {
            t.heads.len() * n_cells
        } else {
            0
        };
        let chunks: Vec<_> = (0..n)
            .step_by(req.chunk)
            .map(|a| a..(a + req.chunk).min(n))
            .collect();
        let empty = || -> (Vec<Rows>, Vec<(f64, u32)>) {
            (
                whats.iter().map(|_| Rows::default()).collect(),
                vec![(0f64, 0u32); width],
            )
        };
        let (rows, mass) = chunks
            .into_par_iter()
            .try_fold(empty, |(mut rows, mut mass), qs| {
                for (a, b) in rows.iter_mut().zip(chunk(&ctx, qs, whats, &mut mass)?) {
                    a.append(b);
                }
                Ok::<_, AttnError>((rows, mass))
            })
            .try_reduce(empty, |(mut a, mut ma), (b, mb)| {
                for (x, y) in a.iter_mut().zip(b) {
                    x.append(y);
                }
                for (x, y) in ma.iter_mut().zip(mb) {
                    x.0 += y.0;
                    x.1 += y.1;
                }
                Ok((a, ma))
            })?;
        for ((tables, what), rows) in out.iter_mut().zip(whats).zip(rows) {
            let rows = if *what == Reduce::Mass {
                mass_rows(t, &keys, &starts, &mass)
            } else {
                rows
            };
            tables.push(rows.table(*what));
        }
    }
    for (tables, what) in out.iter_mut().zip(whats) {
        if tables.is_empty() {
            tables.push(Rows::default().table(*what));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::geometry::Model;
    use crate::open::OpenOptions;
    use crate::values::rotation_decide::Mode;
    use crate::{State, WalkOptions};
    use std::path::Path;

    fn opened() -> (Opened, Vec<LayerAttn>) {
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data");
        let model = Model::read(data.join("models/tiny-qwen3.gguf")).unwrap();
        let sf = State::open(
            data.join("qwen3tiny-f16-fa/seq-0.ggsq"),
            WalkOptions::default(),
        )
        .unwrap();
        let opts = OpenOptions {
            model: Some(&model.geometry),
            rotation: Mode::None,
            ..OpenOptions::default()
        };
        let op = Opened::new(sf, opts).unwrap();
        (op, LayerAttn::of_model(&model).unwrap())
    }

    #[test]
    fn a_zero_query_spreads_its_weight_evenly_over_the_cells_it_sees() {
        let (op, layers) = opened();
        let blocks = [Block {
            model_layer: 1,
            offset: 0,
            n_head: 4,
            head_dim: 32,
        }];
        let values = vec![0f32; 3 * 128];
        let req = Request {
            opened: &op,
            layers: &layers,
            queries: Queries {
                values: &values,
                row_len: 128,
                pos: &[0, 3, 6],
                seq: &[0, 0, 0],
                blocks: &blocks,
            },
            model_layers: None,
            heads: Some(&[2]),
            incomplete: Incomplete::Error,
            chunk: 2,
        };
        let w = &run(&req, Reduce::Weights).unwrap()[0];
        assert_eq!(w.rows(), 1 + 4 + 7);
        let weight = w.columns.iter().find(|c| c.name == "weight").unwrap();
        let Values::F64(ws) = &weight.values else {
            panic!()
        };
        assert_eq!(ws[0], 1.0);
        assert!(ws[1..5].iter().all(|x| (x - 0.25).abs() < 1e-15));
        let m = &run(&req, Reduce::Mass).unwrap()[0];
        let mass = m.columns.iter().find(|c| c.name == "mass").unwrap();
        let Values::F64(ms) = &mass.values else {
            panic!()
        };
        let want = 1.0 + 0.25 + 1.0 / 7.0; // cell 0: seen by all three queries
        assert!((ms[0] - want).abs() < 1e-15 && ms.len() == 7);
        // a query of a sequence the state does not hold: refused, or left out
        let req = Request {
            queries: Queries {
                seq: &[0, 0, 4],
                ..req.queries
            },
            ..req
        };
        assert!(matches!(
            run(&req, Reduce::Entropy),
            Err(AttnError::Incomplete(_))
        ));
        let skip = Request {
            incomplete: Incomplete::Skip,
            ..req
        };
        assert_eq!(run(&skip, Reduce::Entropy).unwrap()[0].rows(), 2);
    }

    #[test]
    fn one_pass_of_several_reductions_equals_a_pass_of_each() {
        let (op, layers) = opened();
        let blocks = [Block {
            model_layer: 0,
            offset: 0,
            n_head: 4,
            head_dim: 32,
        }];
        // queries at every position, values of no pattern (a fixed LCG)
        let mut x = 12345u32;
        let values: Vec<f32> = (0..7 * 128)
            .map(|_| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (x >> 8) as f32 / (1 << 24) as f32 - 0.5
            })
            .collect();
        let req = Request {
            opened: &op,
            layers: &layers,
            queries: Queries {
                values: &values,
                row_len: 128,
                pos: &[0, 1, 2, 3, 4, 5, 6],
                seq: &[0; 7],
                blocks: &blocks,
            },
            model_layers: None,
            heads: None,
            incomplete: Incomplete::Error,
            chunk: 64, // one chunk: the same sums in the same order
        };
        let whats = [
            Reduce::Mass,
            Reduce::TopK(3),
            Reduce::Entropy,
            Reduce::Weights,
        ];
        let many = run_many(&req, &whats).unwrap();
        assert_eq!(many.len(), whats.len());
        for (tables, what) in many.iter().zip(whats) {
            assert_eq!(*tables, run(&req, what).unwrap());
            assert!(tables[0].rows() > 0);
        }
        assert_eq!(run_many(&req, &[]).unwrap().len(), 0);
    }
}
