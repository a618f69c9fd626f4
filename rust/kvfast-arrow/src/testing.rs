//! Small valid states for the binding's unit tests (no Python needed).

use half::f16;
use kvfast_core::{GgmlType, State, WalkOptions};

/// The value of K (or V, negated) value `j` of `cell` in `layer` of [`state`]: exact in f16.
pub fn value(cell: u32, layer: u32, kind: &str, j: u32) -> f32 {
    let v = (cell * 16 + layer * 4 + j) as f32 / 4.0;
    if kind == "k" {
        v
    } else {
        -v
    }
}

/// A raw sequence state with the io magic: one cache, one stream of `cells` cells of sequence 0 at
/// positions 0.., and `layers` layers of K and V rows of `n_embd` values each; K of type `k`
/// (f16, or q8_0 with n_embd a multiple of 32 and at most 4 cells), V f16. Values: [`value`].
pub fn state(cells: u32, layers: u32, n_embd: u32, k: GgmlType) -> State {
    let mut b = Vec::new();
    for w in [0xAF14_3CD8u32, 0, 1, cells] {
        b.extend(w.to_le_bytes());
    }
    for p in 0..cells {
        b.extend((p as i32).to_le_bytes());
        b.extend(1u32.to_le_bytes());
        b.extend(0i32.to_le_bytes());
    }
    b.extend(0u32.to_le_bytes()); // v_trans
    b.extend(layers.to_le_bytes());
    for (kind, ty) in [("k", k), ("v", GgmlType::F16)] {
        for l in 0..layers {
            b.extend(ty.id().to_le_bytes());
            b.extend(ty.row_bytes(n_embd as u64).unwrap().to_le_bytes());
            for c in 0..cells {
                let row: Vec<f32> = (0..n_embd).map(|j| value(c, l, kind, j)).collect();
                if ty == GgmlType::F16 {
                    for x in row {
                        b.extend(f16::from_f32(x).to_bits().to_le_bytes());
                    }
                } else {
                    for block in row.chunks(32) {
                        b.extend(f16::from_f32(0.25).to_bits().to_le_bytes());
                        b.extend(block.iter().map(|x| (x * 4.0) as i8 as u8));
                    }
                }
            }
        }
    }
    State::from_bytes(b, WalkOptions::default()).expect("a valid state")
}
