//! The decoding kernels are safe functions: whatever slices they are given, they read only inside
//! them, never panic, and mark the values their source does not hold as NaN.

use kvfast_core::format::types::ALL_TYPES;
use kvfast_core::values::decode::{decode_row, decode_rows, decode_transposed, transpose_bytes};
use kvfast_core::values::quantize::quantize_row;

#[test]
fn decode_row_reads_only_whole_blocks_it_is_given() {
    for ty in ALL_TYPES {
        let (bb, bl) = (ty.block_bytes(), ty.block_len());
        let values: Vec<f32> = (0..4 * bl).map(|i| i as f32 * 0.25 - 3.0).collect();
        let mut bytes = vec![0u8; 4 * bb];
        quantize_row(ty, &values, &mut bytes);
        let mut full = vec![0f32; 4 * bl];
        assert_eq!(decode_row(ty, &bytes, &mut full), 4 * bl);
        // a source shorter than the destination: one and a half blocks
        let short = &bytes[..bb + bb / 2];
        // heap copies, so that a read past the end is one past an allocation (ASan, valgrind)
        let short = short.to_vec();
        for n in [0, 1, bl, 64 * bl, 4096] {
            let mut out = vec![7f32; n];
            let done = decode_row(ty, &short, &mut out);
            assert_eq!(done, bl.min(n / bl * bl), "{ty} into {n}");
            assert_eq!(&out[..done], &full[..done], "{ty}");
            assert!(out[done..].iter().all(|v| v.is_nan()), "{ty}");
        }
        // a source longer than the destination: only the destination's blocks
        let mut one = vec![0f32; bl];
        assert_eq!(decode_row(ty, &bytes, &mut one), bl);
        assert_eq!(one, full[..bl]);
        // a destination that is not whole blocks
        if bl > 1 {
            let mut odd = vec![0f32; bl + 5];
            assert_eq!(decode_row(ty, &bytes, &mut odd), bl);
            assert!(odd[bl..].iter().all(|v| v.is_nan()));
        }
    }
}

/// The hole of issue 11: a wide f16 destination over a narrow source. Before the check, the F16C
/// path loaded 16 bytes at a time past the source (and with a large destination, past the map).
#[test]
fn f16_into_a_wider_row_stays_in_its_source() {
    let ty = kvfast_core::GgmlType::F16;
    let src: Vec<u8> = (0..64u8).flat_map(|i| [i, 0x3C]).collect(); // 64 values
    let mut out = vec![0f32; 1 << 16];
    assert_eq!(decode_row(ty, &src, &mut out), 64);
    assert!(out[64..].iter().all(|v| v.is_nan()));
    assert!(out[..64].iter().all(|v| (1.0..2.0).contains(v)));
}

#[test]
fn row_and_transpose_kernels_survive_any_geometry() {
    for ty in ALL_TYPES {
        let bytes: Vec<u8> = (0..200u8).map(|b| b.wrapping_mul(37)).collect();
        for (rb, n) in [
            (0, 0),
            (0, 8),
            (8, 0),
            (ty.block_bytes(), ty.block_len()),
            (7, 100),
        ] {
            for cells in [0usize, 1, 3, 1000, usize::MAX / 2] {
                let rows = cells.min(50);
                let mut out = vec![0f32; rows * n.max(1)];
                decode_rows(ty, &bytes, rb, n, 0, &mut out);
                if ty.is_float() {
                    decode_transposed(ty, &bytes, (cells, 0), n, &mut out);
                    decode_transposed(ty, &bytes, (cells, cells / 2), n, &mut out);
                    let mut raw = vec![0u8; out.len() * ty.block_bytes()];
                    transpose_bytes(&bytes, ty.block_bytes(), (cells, 0), n, &mut raw);
                    transpose_bytes(&bytes, ty.block_bytes(), (cells, usize::MAX), n, &mut raw);
                    transpose_bytes(&bytes, 0, (cells, 0), n, &mut raw);
                }
            }
        }
    }
}

#[test]
fn transposed_rows_past_the_cells_are_nan() {
    let ty = kvfast_core::GgmlType::F32;
    // 2 elements x 3 cells, element-major
    let src: Vec<u8> = [1f32, 2., 3., 4., 5., 6.]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut out = vec![0f32; 8]; // four cells asked, three held
    decode_transposed(ty, &src, (3, 0), 2, &mut out);
    assert_eq!(&out[..6], &[1., 4., 2., 5., 3., 6.]);
    assert!(out[6..].iter().all(|v| v.is_nan()));
    // from cell 1: cells 1 and 2, then the missing cell 3
    decode_transposed(ty, &src, (3, 1), 2, &mut out[..6]);
    assert_eq!(&out[..4], &[2., 5., 3., 6.]);
    assert!(out[4..6].iter().all(|v| v.is_nan()));
    let mut raw = vec![0u8; 32];
    transpose_bytes(&src, 4, (3, 0), 2, &mut raw);
    assert_eq!(&raw[..4], &1f32.to_le_bytes());
    assert!(raw[24..].iter().all(|&b| b == 0xFF));
    // runs longer than the source: nothing read, all NaN
    decode_transposed(ty, &src, (4, 0), 2, &mut out);
    assert!(out.iter().all(|v| v.is_nan()));
}
