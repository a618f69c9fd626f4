//! Which records a pass reads: a selection of caches, layers, kinds and heads, checked against a
//! walked layout and turned into jobs (one per record of each stream), and the cells a job reads.
//!
//! Every pass over values starts here: the value table, statistics, quantization losses and
//! comparisons.

use std::collections::{BTreeSet, HashMap};

use crate::format::layout::{Kind, Layout, Record, Stream};
use crate::format::types::GgmlType;
use crate::values::rope::{rope_of, CellRope, Rope, RopeSpec};
use crate::values::view::RecordView;

/// A selection or a plan that does not fit the state's records.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("head_dim must be positive")]
    HeadDimZero,
    #[error("head_dim {head_dim} does not divide the {n} values per {kind} row of layer {layer}")]
    HeadDim {
        head_dim: u64,
        n: u64,
        kind: Kind,
        layer: u32,
    },
    #[error("head_dim {head_dim} makes {n} heads of layer {layer} {kind} rows: at most 65536")]
    TooManyHeads {
        head_dim: u64,
        n: u64,
        kind: Kind,
        layer: u32,
    },
    #[error("head {head} out of range: layer {layer} {kind} has {n} heads")]
    Head {
        head: u32,
        layer: u32,
        kind: Kind,
        n: usize,
    },
    /// K and V of different head sizes cannot share one fixed-size values column.
    #[error("the selected records have different head sizes {0:?}: select kinds=['k'] or ['v'] separately")]
    HeadSizes(BTreeSet<usize>),
    #[error("layer {layer} {kind} rows of {n} values are not whole {ty} blocks of {block}", block = .ty.block_len())]
    NotWholeBlocks {
        layer: u32,
        kind: Kind,
        n: usize,
        ty: GgmlType,
    },
    #[error("rotation group {group} does not divide the {n} values of layer {layer} {kind} rows")]
    RotationGroup {
        group: usize,
        n: usize,
        layer: u32,
        kind: Kind,
    },
}

/// What to read: None selects every cache (layer, head); kinds in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub caches: Option<Vec<u32>>,
    pub layers: Option<Vec<u32>>,
    pub kinds: Vec<Kind>,
    pub heads: Option<Vec<u32>>,
    /// Values per K (V) head; None: one head spans the row.
    pub head_dim_k: Option<u64>,
    pub head_dim_v: Option<u64>,
    /// Per cache, its own [K, V] head sizes where the memory's parts differ (an indexer cache, a
    /// sliding-window cache of another head size); no entry, or None: `head_dim_k` / `head_dim_v`.
    pub cache_head_dims: Vec<[Option<u64>; 2]>,
    /// Per cache, the [K, V] groups llama.cpp's rotation is undone in (0, or no entry: as stored).
    pub rotation: Vec<[usize; 2]>,
    /// Per cache and layer, the RoPE to undo in K rows (keys before RoPE; no entry: as stored).
    pub rope: RopeSpec,
}

impl Default for Selection {
    /// Everything, K then V, one head per row, values as stored.
    fn default() -> Self {
        Selection {
            caches: None,
            layers: None,
            kinds: Kind::BOTH.to_vec(),
            heads: None,
            head_dim_k: None,
            head_dim_v: None,
            cache_head_dims: vec![],
            rotation: vec![],
            rope: vec![],
        }
    }
}

/// One record of one stream to read, with its head size and rotation.
#[derive(Debug, Clone, Copy)]
pub struct Job<'a> {
    pub cache: u32,
    pub stream: &'a Stream,
    pub layer: u32,
    pub kind: Kind,
    pub rec: &'a Record,
    /// Values per head (positive, dividing the row).
    pub head_dim: usize,
    /// Undo the rotation in groups of this many values (0: as stored).
    pub rotation: usize,
    /// The RoPE to undo in each cell, from its position (None: as stored).
    pub rope: Option<Rope>,
}

impl<'a> Job<'a> {
    /// Nonzero when the values are not read as stored (a rotation or a RoPE to undo): what the
    /// table plan decides f16 views and decoding on.
    pub fn transform(&self) -> usize {
        self.rotation.max(usize::from(self.rope.is_some()))
    }

    /// The per-cell RoPE undoing of this job's rows (None: as stored).
    pub fn cell_rope(&self) -> Option<CellRope<'a>> {
        self.rope.map(|rope| CellRope::of(rope, self.stream))
    }

    pub fn n_heads(&self) -> usize {
        (self.rec.n_embd as usize)
            .checked_div(self.head_dim)
            .unwrap_or(0)
    }

    /// The record's rows in `bytes` (the state's, as walked), in the basis the job reads them in.
    pub fn view(&self, bytes: &'a [u8]) -> RecordView<'a> {
        RecordView::new(bytes, self.rec, self.stream.cell_count as usize)
            .with_rotation(self.rotation)
            .with_rope(self.cell_rope())
    }
}

/// Heads of one row at most (the head column is 16 bits).
pub const MAX_HEADS: u64 = 1 << 16;

fn head_dim(rec: &Record, given: Option<u64>, kind: Kind, layer: u32) -> Result<usize, PlanError> {
    match given {
        None => Ok(rec.n_embd as usize),
        Some(0) => Err(PlanError::HeadDimZero),
        Some(h) if rec.n_embd % h != 0 => Err(PlanError::HeadDim {
            head_dim: h,
            n: rec.n_embd,
            kind,
            layer,
        }),
        Some(h) if rec.n_embd / h > MAX_HEADS => Err(PlanError::TooManyHeads {
            head_dim: h,
            n: rec.n_embd / h,
            kind,
            layer,
        }),
        Some(h) => Ok(h as usize),
    }
}

/// The selected records, in the order cache, stream, kind (as selected), layer; a layer without V
/// has no V job. Fails on a head size that does not divide a row, or a head a record lacks.
pub fn jobs<'a>(layout: &'a Layout, sel: &Selection) -> Result<Vec<Job<'a>>, PlanError> {
    let mut out = Vec::new();
    for (ci, cache) in layout.caches.iter().enumerate() {
        let ci = ci as u32;
        if sel.caches.as_ref().is_some_and(|c| !c.contains(&ci)) {
            continue;
        }
        for stream in &cache.streams {
            for &kind in &sel.kinds {
                let own = sel.cache_head_dims.get(ci as usize);
                let given = match kind {
                    Kind::K => own.and_then(|h| h[0]).or(sel.head_dim_k),
                    Kind::V => own.and_then(|h| h[1]).or(sel.head_dim_v),
                    // R and S rows have no heads: one spans the row
                    Kind::R | Kind::S => None,
                };
                for (li, layer) in stream.layers.iter().enumerate() {
                    let li = li as u32;
                    if sel.layers.as_ref().is_some_and(|l| !l.contains(&li)) {
                        continue;
                    }
                    let Some(rec) = layer.record(kind) else {
                        continue;
                    };
                    if rec.n_embd == 0 {
                        continue; // rows of no value (LFM2 keeps no S): nothing to read
                    }
                    let head_dim = head_dim(rec, given, kind, li)?;
                    if let Some(hs) = &sel.heads {
                        let n = rec.n_embd as usize / head_dim;
                        if let Some(&head) = hs.iter().find(|h| **h as usize >= n) {
                            return Err(PlanError::Head {
                                head,
                                layer: li,
                                kind,
                                n,
                            });
                        }
                    }
                    out.push(Job {
                        cache: ci,
                        stream,
                        layer: li,
                        kind,
                        rec,
                        head_dim,
                        rotation: sel.rotation.get(ci as usize).map_or(0, |r| r[kind.index()]),
                        rope: rope_of(&sel.rope, ci, li, kind),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// Jobs grouped by (cache, layer, kind) across streams, groups in first-seen order: the records a
/// per-layer statistic merges.
pub fn grouped(jobs: Vec<Job<'_>>) -> Vec<Vec<Job<'_>>> {
    let mut at: HashMap<(u32, u32, Kind), usize> = HashMap::new();
    let mut groups: Vec<Vec<Job>> = vec![];
    for job in jobs {
        let i = *at
            .entry((job.cache, job.layer, job.kind))
            .or_insert_with(|| {
                groups.push(vec![]);
                groups.len() - 1
            });
        groups[i].push(job);
    }
    groups
}

/// (cell, sequence) pairs of the cells at positions >= `skip_first`, in cell order: a cell of
/// several sequences appears once per sequence; a cell that lists none belongs to the state's own
/// sequence, `seq_default`.
pub fn cell_seq_pairs(
    s: &Stream,
    seq_default: Option<i32>,
    skip_first: i32,
) -> Vec<(usize, Option<i32>)> {
    let mut pairs = Vec::with_capacity(s.cell_count as usize);
    for c in 0..s.cell_count as usize {
        if s.pos[c] < skip_first {
            continue;
        }
        let seqs = s.cell_seqs(c);
        if seqs.is_empty() {
            pairs.push((c, seq_default));
        } else {
            pairs.extend(seqs.iter().map(|q| (c, Some(*q))));
        }
    }
    pairs
}

/// The cells at positions >= `skip_first`, each once.
pub fn cells_from(s: &Stream, skip_first: i32) -> Vec<usize> {
    (0..s.cell_count as usize)
        .filter(|c| s.pos[*c] >= skip_first)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{layout, stream};

    /// Two caches (an iSWA pair): cache 0 of two streams of 2 layers (layer 1 without V), cache 1 of
    /// one stream of one layer; rows of 8 values.
    fn two_caches() -> Layout {
        let layers = [(8, Some(8)), (8, None)];
        layout(vec![
            vec![
                stream(0, &[0, 1], &[&[0], &[0, 1]], &layers),
                stream(1, &[5], &[&[2]], &layers),
            ],
            vec![stream(0, &[0, 1, 2], &[&[0], &[0], &[]], &[(8, Some(8))])],
        ])
    }

    fn keys(jobs: &[Job]) -> Vec<(u32, u32, u32, &'static str)> {
        jobs.iter()
            .map(|j| (j.cache, j.stream.index, j.layer, j.kind.name()))
            .collect()
    }

    #[test]
    fn every_record_in_cache_stream_kind_layer_order() {
        let l = two_caches();
        let all = jobs(&l, &Selection::default()).unwrap();
        assert_eq!(
            keys(&all),
            vec![
                (0, 0, 0, "k"),
                (0, 0, 1, "k"),
                (0, 0, 0, "v"),
                (0, 1, 0, "k"),
                (0, 1, 1, "k"),
                (0, 1, 0, "v"),
                (1, 0, 0, "k"),
                (1, 0, 0, "v"),
            ]
        );
        assert!(all.iter().all(|j| j.head_dim == 8 && j.rotation == 0));
    }

    #[test]
    fn caches_layers_kinds_heads_and_rotation_narrow_it() {
        let l = two_caches();
        let sel = Selection {
            caches: Some(vec![0]),
            layers: Some(vec![0]),
            kinds: vec![Kind::V, Kind::K],
            heads: Some(vec![3]),
            head_dim_k: Some(2),
            head_dim_v: Some(2),
            cache_head_dims: vec![],
            rotation: vec![[0, 64]],
            rope: vec![],
        };
        let js = jobs(&l, &sel).unwrap();
        assert_eq!(
            keys(&js),
            vec![
                (0, 0, 0, "v"),
                (0, 0, 0, "k"),
                (0, 1, 0, "v"),
                (0, 1, 0, "k")
            ]
        );
        assert_eq!(
            js.iter().map(|j| j.rotation).collect::<Vec<_>>(),
            vec![64, 0, 64, 0]
        );
        assert_eq!(js[0].n_heads(), 4);
    }

    #[test]
    fn head_sizes_and_heads_that_do_not_fit_are_refused() {
        let l = two_caches();
        let sel = |k, heads| Selection {
            head_dim_k: Some(k),
            heads,
            ..Selection::default()
        };
        assert_eq!(jobs(&l, &sel(0, None)).unwrap_err(), PlanError::HeadDimZero);
        let e = jobs(&l, &sel(3, None)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "head_dim 3 does not divide the 8 values per k row of layer 0"
        );
        let e = jobs(&l, &sel(4, Some(vec![1, 2]))).unwrap_err();
        assert_eq!(e.to_string(), "head 2 out of range: layer 0 k has 2 heads");
    }

    #[test]
    fn groups_merge_streams_in_first_seen_order() {
        let l = two_caches();
        let groups = grouped(jobs(&l, &Selection::default()).unwrap());
        let heads: Vec<_> = groups
            .iter()
            .map(|g| (g[0].cache, g[0].layer, g[0].kind.name(), g.len()))
            .collect();
        assert_eq!(
            heads,
            vec![
                (0, 0, "k", 2),
                (0, 1, "k", 2),
                (0, 0, "v", 2),
                (1, 0, "k", 1),
                (1, 0, "v", 1)
            ]
        );
        assert_eq!(groups[0][1].stream.index, 1);
    }

    #[test]
    fn a_shared_cell_once_per_sequence_and_none_for_the_state_sequence() {
        let l = two_caches();
        let s = &l.caches[0].streams[0];
        assert_eq!(
            cell_seq_pairs(s, None, 0),
            vec![(0, Some(0)), (1, Some(0)), (1, Some(1))]
        );
        assert_eq!(cell_seq_pairs(s, None, 1), vec![(1, Some(0)), (1, Some(1))]);
        let s = &l.caches[1].streams[0];
        assert_eq!(cell_seq_pairs(s, Some(7), 2), vec![(2, Some(7))]);
        assert_eq!(cells_from(s, 1), vec![1, 2]);
        assert_eq!(cells_from(&l.caches[0].streams[0], 0), vec![0, 1]);
    }
}
