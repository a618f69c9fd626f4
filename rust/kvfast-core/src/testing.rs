//! Layouts built field by field for the planners' unit tests (no bytes behind them).

use crate::format::layout::{Cache, Container, Kind, Layer, Layout, Memory, Record, Stream};
use crate::format::types::GgmlType;

/// A record of `n_embd` values per cell (its offsets mean nothing).
pub fn record(ty: GgmlType, n_embd: u64) -> Record {
    let row_bytes = ty.row_bytes(n_embd).unwrap_or(0);
    Record {
        kind: Kind::K,
        ty,
        n_embd,
        row_bytes,
        header_offset: 0,
        header_len: 12,
        data_offset: 0,
        data_len: 0,
        transposed: false,
    }
}

/// A stream of cells at `pos`, cell i listing the sequences `seqs[i]`, with one layer per
/// `(K values, V values)` entry, f16.
pub fn stream(index: u32, pos: &[i32], seqs: &[&[i32]], layers: &[(u64, Option<u64>)]) -> Stream {
    let mut seq_start = vec![0u32];
    let mut seq_ids = vec![];
    for s in seqs {
        seq_ids.extend_from_slice(s);
        seq_start.push(seq_ids.len() as u32);
    }
    Stream {
        index,
        offset: 0,
        cell_count: pos.len() as u32,
        meta_offset: 0,
        meta_len: 0,
        pos: pos.to_vec(),
        seq_start,
        seq_ids,
        ext: None,
        ext_width: 0,
        layer_header_offset: 0,
        v_trans: false,
        layers: layers
            .iter()
            .map(|&(k, v)| Layer {
                k: record(GgmlType::F16, k),
                v: v.map(|v| Record {
                    kind: Kind::V,
                    ..record(GgmlType::F16, v)
                }),
            })
            .collect(),
    }
}

/// A whole state (no sequence of its own) of these caches' streams.
pub fn layout(caches: Vec<Vec<Stream>>) -> Layout {
    Layout {
        size: 0,
        container: Container::RawState,
        version: None,
        seq_id: None,
        arch: None,
        tokens: None,
        server_tokens: None,
        outputs: None,
        ext_bytes: 0,
        features: vec![],
        prefix: vec![],
        caches: caches
            .into_iter()
            .map(|streams| Cache {
                offset: 0,
                has_n_stream: true,
                memory: Memory::Attention,
                streams,
            })
            .collect(),
        rows_on_device: false,
    }
}

/// Tiny Qwen3's sequence state of tests/data opened with its model (rotation left as stored),
/// and the model's attention layers: the attention passes' unit tests.
pub fn tiny_qwen3_attention() -> (
    crate::open::Opened,
    Vec<crate::attention::params::LayerAttn>,
) {
    use crate::model::geometry::Model;
    use crate::open::{OpenOptions, Opened};
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data");
    let model = Model::read(data.join("models/tiny-qwen3.gguf")).unwrap();
    let sf = crate::State::open(
        data.join("qwen3tiny-f16-fa/seq-0.ggsq"),
        crate::WalkOptions::default(),
    )
    .unwrap();
    let opts = OpenOptions {
        model: Some(&model.geometry),
        rotation: crate::values::rotation_decide::Mode::None,
        ..OpenOptions::default()
    };
    let op = Opened::new(sf, opts).unwrap();
    (
        op,
        crate::attention::params::LayerAttn::of_model(&model).unwrap(),
    )
}
