//! What a row would lose in a cache of another type: llama.cpp's store-and-load, simulated with
//! ggml's reference quantizer and dequantization, its rotation included where it applies one.

use std::cell::RefCell;

use crate::format::layout::Kind;
use crate::format::types::GgmlType;
use crate::plan::select::PlanError;
use crate::values::decode::decode_row;
use crate::values::quantize::{q8_0_round_trip, quantize_row};
use crate::values::rotation::hadamard_groups;

/// The round trip of a row through a cache of type `ty`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundTrip {
    pub ty: GgmlType,
    /// llama.cpp's rotation group (0: none): rotate, quantize, dequantize, rotate back (the
    /// Hadamard matrix is its own inverse).
    pub rotation: usize,
}

impl RoundTrip {
    /// The round trip of layer `layer`'s `kind` rows of `n` values, checked: whole blocks of `ty`,
    /// and a rotation group (if any) that is a power of two dividing the row.
    pub fn new(
        ty: GgmlType,
        rotation: usize,
        n: usize,
        layer: u32,
        kind: Kind,
    ) -> Result<Self, PlanError> {
        if ty.row_bytes(n as u64).is_none() {
            return Err(PlanError::NotWholeBlocks { layer, kind, n, ty });
        }
        if rotation > 0 && (!rotation.is_power_of_two() || n % rotation != 0) {
            return Err(PlanError::RotationGroup {
                group: rotation,
                n,
                layer,
                kind,
            });
        }
        Ok(RoundTrip { ty, rotation })
    }

    /// `y` = `x` stored and loaded. The quantized row is sized from `x` itself, so no row is ever
    /// read into another's width. The buffers between are the thread's own, kept from row to row.
    pub fn apply(&self, x: &[f32], y: &mut [f32]) {
        thread_local! {
            static SCRATCH: RefCell<(Vec<f32>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
        }
        SCRATCH.with(|s| match s.try_borrow_mut() {
            Ok(mut s) => {
                let (r, q) = &mut *s;
                self.apply_with(x, y, r, q)
            }
            // never: apply does not call itself
            Err(_) => self.apply_with(x, y, &mut Vec::new(), &mut Vec::new()),
        })
    }

    fn apply_with(&self, x: &[f32], y: &mut [f32], r: &mut Vec<f32>, q: &mut Vec<u8>) {
        let ty = self.ty;
        let src = if self.rotation > 0 {
            r.clear();
            r.extend_from_slice(x);
            hadamard_groups(r, self.rotation);
            &r[..]
        } else {
            x
        };
        if ty == GgmlType::Q8_0 && src.len() % 32 == 0 && y.len() == src.len() {
            q8_0_round_trip(src, y);
        } else {
            q.clear();
            q.resize(ty.row_bytes(src.len() as u64).unwrap_or(0) as usize, 0);
            quantize_row(ty, src, q);
            decode_row(ty, q, y);
        }
        if self.rotation > 0 {
            hadamard_groups(y, self.rotation);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_that_do_not_fit_are_refused() {
        let e = RoundTrip::new(GgmlType::Q8_0, 0, 48, 2, Kind::V).unwrap_err();
        assert_eq!(
            e.to_string(),
            "layer 2 v rows of 48 values are not whole q8_0 blocks of 32"
        );
        let e = RoundTrip::new(GgmlType::Q8_0, 96, 192, 0, Kind::K).unwrap_err();
        assert_eq!(
            e.to_string(),
            "rotation group 96 does not divide the 192 values of layer 0 k rows"
        );
        assert!(RoundTrip::new(GgmlType::Q8_0, 128, 64, 0, Kind::K).is_err());
        assert!(RoundTrip::new(GgmlType::F16, 0, 3, 0, Kind::K).is_ok());
    }

    #[test]
    fn what_the_trip_loses() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 32.0) / 8.0)
            .collect();
        let mut y = vec![0f32; 64];
        // f16 keeps these values exactly
        RoundTrip::new(GgmlType::F16, 0, 64, 0, Kind::K)
            .unwrap()
            .apply(&x, &mut y);
        assert_eq!(x, y);
        // q8_0 loses a little (a block's step is its absmax / 127), rotated or not (the rotation
        // keeps the row's norm)
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>().sqrt();
        for rot in [0, 64] {
            let t = RoundTrip::new(GgmlType::Q8_0, rot, 64, 0, Kind::K).unwrap();
            t.apply(&x, &mut y);
            let diff: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a - b).collect();
            let rel = norm(&diff) / norm(&x);
            assert!(rel > 0.0 && rel < 0.01, "rotation {rot}: {rel}");
        }
        // rotated, the error lands elsewhere: the two trips differ
        let (mut a, mut b) = (vec![0f32; 64], vec![0f32; 64]);
        RoundTrip::new(GgmlType::Q4_0, 0, 64, 0, Kind::K)
            .unwrap()
            .apply(&x, &mut a);
        RoundTrip::new(GgmlType::Q4_0, 64, 64, 0, Kind::K)
            .unwrap()
            .apply(&x, &mut b);
        assert_ne!(a, b);
    }
}
