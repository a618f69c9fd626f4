//! `write_parquet`: the value table written as Parquet for `kvfast.export`, each partition a file,
//! in parallel over the partitions (rayon), the GIL released. The files are kvfast-arrow's
//! (`kvfast_arrow::parquet`); this reads Python's partitions and calls back its progress.

use std::path::PathBuf;
use std::sync::Arc;

use kvfast_arrow::export_columns::{layer_types, CellTokens};
use kvfast_arrow::parquet::{check_zstd, write_part, Part, Rec, Settings, Shared};
use kvfast_core::plan::select::{jobs, Selection};
use kvfast_core::plan::table_plan::{out_type, Dtype, Out};
use pyo3::prelude::*;
use rayon::prelude::*;

use crate::errors::{Error, Result};
use crate::state::{parse_kind, PyState};

/// Write each partition's records, (cache, layer, kind), to its file (folders made as needed; no
/// file for a partition of no record), in parallel; `advance(nbytes)` is called (with the GIL)
/// after each record with its bytes in the state. `dtype` of a partition: None (as stored),
/// "float32", or "native" (as stored where every record of the partition reads as float16, else
/// float32). `tokens` and `pieces` give the `token` and `piece` columns: per (cache, stream), each
/// cell's token and its piece's index in `pieces` (negative: not known); `k_type` and `v_type`
/// are each record's layer's types. Returns, per partition, the rows written and the values'
/// type ("float16" or "float32"; None when no file was written).
#[pyfunction]
#[pyo3(signature = (state, parts, dump, path, index_schema, tokens, pieces, advance, zstd=None, split=false, page_bytes=1048576, row_group_bytes=67108864))]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub fn write_parquet(
    py: Python<'_>,
    state: &Bound<'_, PyState>,
    parts: Vec<(PathBuf, Vec<(u32, u32, String)>, Option<String>)>,
    dump: String,
    path: String,
    index_schema: Vec<u8>,
    tokens: Vec<(u8, u8, Vec<i32>, Vec<i32>)>,
    pieces: Vec<String>,
    advance: Py<PyAny>,
    zstd: Option<i32>,
    split: bool,
    page_bytes: usize,
    row_group_bytes: usize,
) -> Result<Vec<(u64, Option<&'static str>)>> {
    let st = state.get();
    let sf = st.get()?;
    let index = Arc::new(arrow_ipc::convert::try_schema_from_ipc_buffer(
        &index_schema,
    )?);
    if let Some(level) = zstd {
        check_zstd(level)?;
    }
    let base = sf.everything();
    let mut todo = Vec::with_capacity(parts.len());
    for (dest, recs, dtype) in parts {
        let mut records = Vec::with_capacity(recs.len());
        let mut f16 = true;
        for (cache, layer, kind) in recs {
            let kind = parse_kind(&kind)?;
            let sel = Selection {
                caches: Some(vec![cache]),
                layers: Some(vec![layer]),
                kinds: vec![kind],
                ..base.clone()
            };
            let js = jobs(&sf.layout, &sel)?;
            f16 &= js
                .iter()
                .all(|j| out_type(j.rec.ty, Dtype::Stored, j.transform()) == Out::F16);
            st.ready(py, &sf, &sel)?; // a remote state: its rows fetched first
            let (k_type, v_type) = layer_types(&sf.layout, cache, layer);
            records.push(Rec {
                sel,
                nbytes: js.iter().map(|j| j.rec.data_len).sum(),
                k_type,
                v_type,
            });
        }
        let dtype = match dtype.as_deref() {
            None => Dtype::Stored,
            Some("float32") => Dtype::F32,
            Some("native") if f16 => Dtype::Stored,
            Some("native") => Dtype::F32,
            Some(d) => return Err(Error::Dtype(d.to_string())),
        };
        todo.push(Part {
            dest,
            records,
            dtype,
        });
    }
    let tokens = CellTokens {
        cells: tokens
            .into_iter()
            .map(|(cache, stream, token, piece)| {
                ((cache, stream), token.into_iter().zip(piece).collect())
            })
            .collect(),
        pieces,
    };
    let shared = Shared {
        sf: &sf,
        tokens: &tokens,
        model_layers: sf.model_layers.clone(),
        seq_default: sf.layout.own_seq(),
        dump: &dump,
        path: &path,
        index,
        settings: Settings {
            zstd,
            split,
            page_bytes: page_bytes.max(1),
            row_group_bytes,
        },
    };
    let advance = |nbytes: u64| -> Result<()> {
        Python::attach(|py| advance.call1(py, (nbytes,)))?;
        Ok(())
    };
    py.detach(|| {
        kvfast_core::parallel::install(|| {
            todo.par_iter()
                .map(|p| write_part(&shared, p, advance))
                .collect::<Result<Vec<_>>>()
        })
    })
}
