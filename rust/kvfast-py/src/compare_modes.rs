//! Comparisons whose cells match by position alone (sequences ignored), optionally below a
//! position: `kvfast.compare(match="position" | "tokens")` (kvfast-core's `match_position`).

use std::collections::HashMap;

use kvfast_core::match_position::{match_positions, PositionIndex};
use kvfast_core::matching::check_geometry;
use kvfast_core::rope::{rope_of, CellRope};
use kvfast_core::select::jobs;
use kvfast_core::stats::compare as compare_rows;
use kvfast_core::view::RecordView;
use pyo3::prelude::*;

use crate::analysis::Select;
use crate::columns::Columns;
use crate::errors::Result;
use crate::state::State;
use crate::stream::ArrowStream;

/// Errors of `b` against `a`, cells matched by position alone; only A's cells below `below` when
/// given. The columns of `compare`.
#[pyfunction]
#[pyo3(signature = (a, b, sel, below=None))]
pub fn compare_positions(
    py: Python<'_>,
    a: &State,
    b: &State,
    sel: Select,
    below: Option<i32>,
) -> Result<ArrowStream> {
    let (sa, sb) = (a.get()?, b.get()?);
    let pass = sel.pass(a)?;
    let rot_b = b.rotation_groups();
    let rope_b = b.rope_spec();
    py.detach(|| {
        check_geometry(&sa.layout, &sb.layout)?;
        let mut out = Columns::default();
        let mut idx: [Vec<i32>; 5] = Default::default();
        let (mut ml, mut kinds, mut seqs) = (vec![], vec![], vec![]);
        let mut cols: [Vec<f64>; 4] = Default::default();
        let mut index_b: HashMap<u32, PositionIndex> = HashMap::new();
        for job in jobs(&sa.layout, &pass.sel)? {
            let cb = &sb.layout.caches[job.cache as usize];
            let ib = index_b
                .entry(job.cache)
                .or_insert_with(|| PositionIndex::new(cb));
            let matched = match_positions(job.cache, job.stream, sa.layout.own_seq(), ib, below)?;
            let va = job.view(sa.bytes());
            let nh = job.n_heads();
            let m = pass.model_layer(&sa, &job);
            for part in matched {
                let s_b = &cb.streams[part.stream];
                let Some(rec_b) = s_b
                    .layers
                    .get(job.layer as usize)
                    .and_then(|l| l.record(job.kind))
                else {
                    continue; // never: the geometry and the walk make B's streams agree with A's
                };
                let vb = RecordView::new(sb.bytes(), rec_b, s_b.cell_count as usize)
                    .with_rotation(
                        rot_b
                            .get(job.cache as usize)
                            .map_or(0, |g| g[job.kind.index()]),
                    )
                    .with_rope(
                        rope_of(&rope_b, job.cache, job.layer, job.kind)
                            .map(|rope| CellRope::of(rope, s_b)),
                    );
                let stats = compare_rows(&va, &vb, &part.cells, job.head_dim);
                for (i, st) in stats.iter().enumerate() {
                    let (ca, _) = part.cells[i / nh];
                    for (col, v) in idx.iter_mut().zip([
                        job.cache as i32,
                        job.layer as i32,
                        ca as i32,
                        job.stream.pos[ca],
                        (i % nh) as i32,
                    ]) {
                        col.push(v);
                    }
                    ml.push(m);
                    kinds.push(job.kind.name());
                    seqs.push(part.seqs[i / nh]);
                    for (col, v) in cols.iter_mut().zip([st.mse, st.max_abs, st.cosine, st.rel]) {
                        col.push(v);
                    }
                }
            }
        }
        let [cache, layer, cell, pos, head] = idx;
        out.i32("cache", cache);
        out.i32("layer", layer);
        out.opt_i32("model_layer", ml);
        out.kind("kind", &kinds);
        out.i32("cell", cell);
        out.i32("pos", pos);
        out.opt_i32("seq_id", seqs);
        out.i32("head", head);
        let [mse, max_abs, cosine, rel] = cols;
        out.f64("mse", mse);
        out.f64("max_abs", max_abs);
        out.f64("cosine", cosine);
        out.f64("rel", rel);
        Ok(out.finish())
    })
}
