//! A state's records as one list: one entry per (cache, layer, kind), its streams' bytes summed:
//! what scans choose records from, exports partition and progress bars count.

use crate::format::layout::{Kind, Layout};
use crate::format::types::GgmlType;
use crate::model::layer_map::{cache_layers, model_layer};
use crate::plan::columns::{Keys, Table, Values};

/// One (cache, layer, kind) of a state, over every stream of its cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordInfo {
    pub cache: u32,
    pub layer: u32,
    /// The model's own index of the layer (None: not known).
    pub model_layer: Option<i32>,
    pub kind: Kind,
    pub ty: GgmlType,
    /// Values per cell (0: a state the model does not keep, LFM2's S).
    pub n_embd: u64,
    /// Row bytes of every stream's record.
    pub nbytes: u64,
}

/// Every record, in cache order, then layer, then kind (K, V; R, S); a layer without V (an MLA
/// cache) has no V entry.
pub fn records(layout: &Layout, map: &[Option<Vec<i32>>]) -> Vec<RecordInfo> {
    let mut out = vec![];
    for (ci, cache) in layout.caches.iter().enumerate() {
        let kinds: &[Kind] = if cache.memory.is_recurrent() {
            &[Kind::R, Kind::S]
        } else {
            &Kind::BOTH
        };
        for li in 0..cache_layers(cache) {
            for &kind in kinds {
                let mut found = cache
                    .streams
                    .iter()
                    .filter_map(|s| s.layers.get(li)?.record(kind));
                let Some(first) = found.next() else {
                    continue;
                };
                let nbytes = first.data_len + found.map(|r| r.data_len).sum::<u64>();
                out.push(RecordInfo {
                    cache: ci as u32,
                    layer: li as u32,
                    model_layer: model_layer(map, ci as u32, li as u32),
                    kind,
                    ty: first.ty,
                    n_embd: first.n_embd,
                    nbytes,
                });
            }
        }
    }
    out
}

/// The records as a table: cache, layer, model_layer, kind, then type (the ggml type's name),
/// n_embd and nbytes.
pub fn records_table(recs: &[RecordInfo]) -> Table {
    let mut keys = Keys::default();
    for r in recs {
        keys.extend(r.cache, r.layer, r.model_layer, r.kind, 1);
    }
    let mut t = Table::default();
    keys.write(&mut t, None);
    t.push(
        "type",
        Values::Str(recs.iter().map(|r| r.ty.name()).collect()),
    );
    t.push(
        "n_embd",
        Values::U64(recs.iter().map(|r| r.n_embd).collect()),
    );
    t.push(
        "nbytes",
        Values::U64(recs.iter().map(|r| r.nbytes).collect()),
    );
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{layout, stream};

    #[test]
    fn one_entry_per_cache_layer_kind_streams_summed() {
        let layers = [(8, Some(8)), (8, None)];
        let mut l = layout(vec![
            vec![
                stream(0, &[0, 1], &[&[0], &[0]], &layers),
                stream(1, &[5], &[&[1]], &layers[..1]),
            ],
            vec![stream(0, &[0, 1, 2], &[&[0], &[0], &[0]], &[(4, Some(4))])],
        ]);
        for c in &mut l.caches {
            for s in &mut c.streams {
                let n = s.cell_count as u64;
                for ly in &mut s.layers {
                    ly.k.data_len = ly.k.row_bytes * n;
                    if let Some(v) = &mut ly.v {
                        v.data_len = v.row_bytes * n;
                    }
                }
            }
        }
        let map = vec![Some(vec![0, 2]), None];
        let got: Vec<_> = records(&l, &map)
            .iter()
            .map(|r| (r.cache, r.layer, r.model_layer, r.kind.name(), r.nbytes))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0, Some(0), "k", 16 * 3), // 2 cells + 1 cell of 8 f16 values
                (0, 0, Some(0), "v", 16 * 3),
                (0, 1, Some(2), "k", 16 * 2), // stream 1 has no layer 1
                (1, 0, None, "k", 8 * 3),
                (1, 0, None, "v", 8 * 3),
            ]
        );
    }
}
