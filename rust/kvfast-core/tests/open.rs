//! Opening: one call decides the geometry, the model-layer map, the model's fit, the rotation and
//! the RoPE, on the states llama.cpp wrote (tests/data) and their models' GGUF headers.

use std::path::PathBuf;

use kvfast_core::model::geometry::Model;
use kvfast_core::open::{OpenError, OpenOptions, Opened};
use kvfast_core::values::rope::Rope;
use kvfast_core::values::rotation_decide::{sample_ranges, BuildHint, Mode, SAMPLE_CELLS};
use kvfast_core::{Kind, State, WalkOptions};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(rel)
}

fn state(rel: &str) -> State {
    State::open(data(rel), WalkOptions::default()).expect("a state llama.cpp wrote")
}

fn model(name: &str) -> Model {
    Model::read(data("models").join(name)).expect("a test model's header")
}

#[test]
fn a_model_gives_head_sizes_the_layer_map_and_the_rotation_group() {
    let m = model("tiny-qwen3.gguf");
    let opts = OpenOptions {
        model: Some(&m.geometry),
        ..OpenOptions::default()
    };
    let op = Opened::new(state("qwen3tiny-q8_0-fa/seq-0.ggsq"), opts).unwrap();
    let hd = m.geometry.head_dim_k;
    assert_eq!(op.head_dims, [Some(hd), Some(m.geometry.head_dim_v)]);
    let n = m.geometry.n_layer as i32;
    assert_eq!(op.model_layers, vec![Some((0..n).collect::<Vec<_>>())]);
    // q8_0 K and V, a head size the rule decides on: certain, whatever the values say
    assert_eq!(op.rotation.len(), 2);
    assert!(op.rotation.iter().all(|d| d.certain && d.ty == "q8_0"));
    assert_eq!(op.rotation_warning, None);
    let sel = op.everything();
    assert_eq!(
        (sel.head_dim_k, sel.head_dim_v),
        (Some(hd), Some(m.geometry.head_dim_v))
    );
    assert_eq!(sel.rotation, op.rotation_groups());
}

#[test]
fn rotation_none_reads_nothing_and_f16_is_never_rotated() {
    let st = state("qwen3tiny-f16-fa/seq-0.ggsq");
    assert!(
        sample_ranges(&st.layout).is_empty(),
        "f16 rows are never sampled"
    );
    let op = Opened::new(st, OpenOptions::default()).unwrap();
    assert!(op.rotation.iter().all(|d| !d.undone && d.certain));
    assert!(op.rotation[0].evidence.starts_with("f16 cache"));
    let opts = OpenOptions {
        rotation: Mode::None,
        ..OpenOptions::default()
    };
    let st = state("qwen3tiny-q8_0-fa/seq-0.ggsq");
    assert!(Opened::reads(&st.layout, &opts).is_empty());
    let op = Opened::new(st, opts).unwrap();
    assert!(op.rotation.iter().all(|d| !d.undone && d.group.is_none()));
}

#[test]
fn the_values_test_reads_a_sample_never_a_whole_record() {
    let st = state("qwen3tiny-q8_0-fa/seq-0.ggsq");
    let ranges = sample_ranges(&st.layout);
    assert!(!ranges.is_empty());
    let cells = st.layout.caches[0].streams[0].cell_count as usize;
    for (_, len) in &ranges {
        let rec = &st.layout.caches[0].streams[0].layers[0].k;
        assert!(*len <= (cells.min(SAMPLE_CELLS) as u64) * rec.row_bytes);
    }
    // six records at most per kind
    assert!(ranges.len() <= 2 * 6);
}

#[test]
fn a_build_hint_decides_before_the_era_and_the_values() {
    let hint = BuildHint {
        rotates: false,
        evidence: "probe manifest: the build does not rotate".into(),
    };
    let opts = OpenOptions {
        hint: Some(&hint),
        ..OpenOptions::default()
    };
    let op = Opened::new(state("qwen3tiny-q8_0-fa/seq-0.ggsq"), opts).unwrap();
    for d in &op.rotation {
        assert!(!d.undone && d.certain);
        assert_eq!(d.evidence, hint.evidence);
    }
}

#[test]
fn a_model_that_does_not_fit_is_refused_naming_what_differs() {
    let m = model("tiny-qwen3.gguf");
    let mut wide = m.geometry.clone();
    wide.n_head_kv = wide.n_head_kv.iter().map(|n| n * 2).collect();
    let opts = OpenOptions {
        model: Some(&wide),
        ..OpenOptions::default()
    };
    match Opened::new(state("qwen3tiny-f16-fa/seq-0.ggsq"), opts) {
        Err(OpenError::Model { message, field }) => {
            assert!(
                message.starts_with("model layer 0: the model has"),
                "{message}"
            );
            assert_eq!(field, None);
        }
        other => panic!("expected a model error, got {:?}", other.err()),
    }
    let opts = OpenOptions {
        head_dim: Some(7),
        ..OpenOptions::default()
    };
    let err = Opened::new(state("qwen3tiny-f16-fa/seq-0.ggsq"), opts)
        .err()
        .unwrap();
    assert!(matches!(err, OpenError::Selection(_)), "{err}");
    assert!(
        err.to_string().contains("head_dim 7 does not divide"),
        "{err}"
    );
}

#[test]
fn keys_before_rope_need_the_rope_and_follow_the_layer_map() {
    let m = model("tiny-qwen3.gguf");
    let no_rope = OpenOptions {
        model: Some(&m.geometry),
        pre_rope: Some(None),
        ..OpenOptions::default()
    };
    let err = Opened::new(state("qwen3tiny-f16-fa/seq-0.ggsq"), no_rope)
        .err()
        .unwrap();
    assert!(err.to_string().contains("needs the model's GGUF"), "{err}");
    let rope_of = |hd: u64| -> Result<[Rope; 2], OpenError> {
        let r = m.rope(hd as usize)?;
        Ok([r.global, r.swa])
    };
    let opts = OpenOptions {
        model: Some(&m.geometry),
        pre_rope: Some(Some(&rope_of)),
        ..OpenOptions::default()
    };
    let op = Opened::new(state("qwen3tiny-f16-fa/seq-0.ggsq"), opts).unwrap();
    let layers = op.state.layout.caches[0].streams[0].layers.len();
    assert_eq!(op.rope.len(), 1);
    assert_eq!(op.rope[0].len(), layers);
    assert!(op.rope[0]
        .iter()
        .all(|r| r.is_some_and(|r| r.head_dim as u64 == op.head_dims[0].unwrap())));
    // the selection carries it to every pass (K only)
    let sel = op.selection(None, None, vec![Kind::K], None);
    assert_eq!(sel.rope, op.rope);
}
