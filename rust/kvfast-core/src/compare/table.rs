//! The errors of one state's values against another's, cells paired by (sequence, position) or by
//! position alone: the table of `kvfast.compare`, as plain columns.

use std::collections::HashMap;

use crate::compare::by_position::{match_positions, PositionIndex};
use crate::compare::matching::{check_geometry, match_cells, CellIndex, Matched, Mismatch};
use crate::format::layout::{Cache, Kind, Layout, Stream};
use crate::plan::columns::{self, Keys, Table, Values};
use crate::plan::select::jobs;
use crate::source::state::State;
use crate::stats::loss::{LossColumns, LossSums};
use crate::stats::passes::compare as compare_rows;
use crate::stats::tables::{Pass, TableError};
use crate::values::rope::{rope_of, CellRope, RopeSpec};

/// (cache, layer, kind): a row of the per-layer table.
type LayerKey = (u32, u32, Kind);

/// How A's cells are paired with B's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// By (sequence, position).
    Sequence,
    /// By position alone, only A's cells below the position when given.
    Position(Option<i32>),
}

/// State B as the comparison reads it: the state, its rotation groups and RoPE to undo.
pub struct Other<'a> {
    pub sf: &'a State,
    pub rotation: &'a [[usize; 2]],
    pub rope: &'a RopeSpec,
}

/// B's cells of one cache, indexed the way `Match` pairs them.
enum Index {
    Cells(CellIndex),
    Positions(PositionIndex, Option<i32>),
}

impl Index {
    fn new(how: Match, cache: &Cache, seq_default: Option<i32>) -> Self {
        match how {
            Match::Sequence => Index::Cells(CellIndex::new(cache, seq_default)),
            Match::Position(below) => Index::Positions(PositionIndex::new(cache), below),
        }
    }

    fn matched(
        &self,
        cache: u32,
        stream: &Stream,
        seq_default: Option<i32>,
    ) -> Result<Vec<Matched>, Mismatch> {
        match self {
            Index::Cells(ib) => match_cells(cache, stream, seq_default, ib),
            Index::Positions(ib, below) => match_positions(cache, stream, seq_default, ib, *below),
        }
    }
}

/// Two tables of B's values against A's, cells paired as `how` says: one row per (cache, layer,
/// kind, cell of A, sequence, head) with mse, max_abs, cosine, rel and nan (the pairs of values
/// left out: either NaN); and one per (cache, layer, kind) with `loss`'s error columns over those
/// rows (pooled and per-row means, as `quant_error`'s).
pub fn compare(a: &Pass, b: &Other, how: Match) -> Result<[Table; 2], TableError> {
    let b_layout: &Layout = &b.sf.layout;
    check_geometry(&a.sf.layout, b_layout)?;
    let mut keys = Keys::default();
    let (mut cell, mut pos, mut head, mut seqs) = (vec![], vec![], vec![], vec![]);
    let mut cols: [Vec<f64>; 4] = Default::default();
    let mut nan = vec![];
    let mut index_b: HashMap<u32, Index> = HashMap::new();
    // the per-layer sums, in the order their records first come
    let mut layer_at: HashMap<LayerKey, usize> = HashMap::new();
    let mut layers: Vec<(LayerKey, Option<i32>, LossSums)> = vec![];
    for job in jobs(&a.sf.layout, a.sel)? {
        let cb = &b_layout.caches[job.cache as usize];
        let ib = index_b
            .entry(job.cache)
            .or_insert_with(|| Index::new(how, cb, b_layout.own_seq()));
        let matched = ib.matched(job.cache, job.stream, a.sf.layout.own_seq())?;
        let va = a.sf.view(&job)?;
        let nh = job.n_heads();
        let ml = crate::model::layer_map::model_layer(a.map, job.cache, job.layer);
        for part in matched {
            let s_b = &cb.streams[part.stream];
            let Some(rec_b) = s_b
                .layers
                .get(job.layer as usize)
                .and_then(|l| l.record(job.kind))
            else {
                continue; // never: the geometry and the walk make B's streams agree with A's
            };
            let vb =
                b.sf.record_view(rec_b, s_b.cell_count as usize)?
                    .with_rotation(
                        b.rotation
                            .get(job.cache as usize)
                            .map_or(0, |g| g[job.kind.index()]),
                    )
                    .with_rope(
                        rope_of(b.rope, job.cache, job.layer, job.kind)
                            .map(|rope| CellRope::of(rope, s_b)),
                    );
            let stats = compare_rows(&va, &vb, &part.cells, job.head_dim);
            keys.extend(job.cache, job.layer, ml, job.kind, stats.len());
            let key = (job.cache, job.layer, job.kind);
            let at = *layer_at.entry(key).or_insert_with(|| {
                layers.push((key, ml, LossSums::default()));
                layers.len() - 1
            });
            let sums = &mut layers[at].2;
            for st in &stats {
                sums.add_row(&st.loss);
            }
            for (i, st) in stats.iter().enumerate() {
                let (ca, _) = part.cells[i / nh];
                cell.push(ca as u32);
                pos.push(job.stream.pos[ca]);
                head.push((i % nh) as u16);
                seqs.push(columns::seq(part.seqs[i / nh]));
                for (col, v) in cols.iter_mut().zip([st.mse, st.max_abs, st.cosine, st.rel]) {
                    col.push(v);
                }
                nan.push(st.loss.nan as u32); // at most a head's values
            }
        }
    }
    let mut out = Table::default();
    keys.write(&mut out, None);
    out.push("cell", Values::U32(cell));
    out.push("pos", Values::I32(pos));
    out.push_opt_u8("seq_id", seqs);
    out.push("head", Values::U16(head));
    for (name, col) in ["mse", "max_abs", "cosine", "rel"].into_iter().zip(cols) {
        out.push(name, Values::F64(col));
    }
    out.push("nan", Values::U32(nan));
    let (mut layer_keys, mut losses) = (Keys::default(), LossColumns::default());
    for ((cache, layer, kind), ml, sums) in &layers {
        layer_keys.extend(*cache, *layer, *ml, *kind, 1);
        losses.push(sums);
    }
    let mut by_layer = Table::default();
    layer_keys.write(&mut by_layer, None);
    losses.write(&mut by_layer);
    Ok([out, by_layer])
}
