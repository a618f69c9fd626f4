//! What a pass of attention is asked: the query vectors (a row per token, each layer's heads in
//! a block of it), the state and the model's attention layers, what to hand out, and the checks
//! of all that against the state; and the layers of the state a pass computes ([`Task`]), with
//! their keys.

use crate::attention::finite;
use crate::attention::keys::Keys;
use crate::attention::params::LayerAttn;
use crate::attention::AttnError;
use crate::format::layout::Kind;
use crate::open::Opened;
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

    /// A task's keys, every stream of its cache (read a KV head at a time by the kernel).
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
            views: vec![],
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
            keys.views.push(op.state.view(&job)?);
            keys.streams.push(job.stream);
        }
        Ok(keys)
    }
}
