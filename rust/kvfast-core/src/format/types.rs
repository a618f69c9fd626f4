//! The ggml types a KV cache can hold.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Iq4Nl,
    Bf16,
}

pub const ALL_TYPES: [GgmlType; 9] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Iq4Nl,
];

impl GgmlType {
    pub fn from_id(id: i32) -> Option<Self> {
        ALL_TYPES.iter().copied().find(|t| t.id() == id)
    }

    pub fn from_name(name: &str) -> Option<Self> {
        ALL_TYPES.iter().copied().find(|t| t.name() == name)
    }

    /// ggml's type id (`enum ggml_type`).
    pub fn id(self) -> i32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Iq4Nl => 20,
            GgmlType::Bf16 => 30,
        }
    }

    /// ggml's name for the type.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Iq4Nl => "iq4_nl",
            GgmlType::Bf16 => "bf16",
        }
    }

    /// Values per block.
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => 1,
            _ => 32,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::Bf16 => 2,
            GgmlType::Q8_0 => 34,
            GgmlType::Q4_0 | GgmlType::Iq4Nl => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
        }
    }

    /// Offset in a block of its first quant byte, after the f16 scale d, the f16 min m (q4_1,
    /// q5_1) and the 32 high bits qh (q5_0, q5_1); 0 for the float types. The quants that follow
    /// hold one value a byte (q8_0) or two, value j in the low nibble of byte j and value j + 16
    /// in its high nibble (the 4- and 5-bit types).
    pub fn quants_at(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => 0,
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Iq4Nl => 2,
            GgmlType::Q4_1 => 4,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 8,
        }
    }

    /// A plain float type (the only ones V may be stored transposed in).
    pub fn is_float(self) -> bool {
        self.block_len() == 1
    }

    /// A block-quantized type (ggml_is_quantized): every type but f32, f16 and bf16.
    pub fn is_quantized(self) -> bool {
        !self.is_float()
    }

    /// Bytes of a row of `n` values, None when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let bl = self.block_len() as u64;
        if n % bl != 0 {
            return None;
        }
        (n / bl).checked_mul(self.block_bytes() as u64)
    }

    /// Values in a row of `bytes` bytes, None when that is not a whole number of blocks.
    pub fn values_in(self, bytes: u64) -> Option<u64> {
        let bb = self.block_bytes() as u64;
        if bytes % bb != 0 {
            return None;
        }
        (bytes / bb).checked_mul(self.block_len() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The list of accepted type ids, for error messages.
pub fn type_list() -> String {
    ALL_TYPES
        .iter()
        .map(|t| format!("{} ({})", t.id(), t.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_round_trip() {
        for t in ALL_TYPES {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None); // q4_2, long gone
        assert_eq!(GgmlType::from_name("q4_k"), None);
    }

    #[test]
    fn quants_fill_the_rest_of_a_block() {
        for t in ALL_TYPES {
            let quant_bytes = t.block_bytes() - t.quants_at();
            if t.is_float() {
                assert_eq!((t.block_len(), t.quants_at()), (1, 0));
            } else if t == GgmlType::Q8_0 {
                assert_eq!(quant_bytes, t.block_len());
            } else {
                assert_eq!(quant_bytes * 2, t.block_len(), "{t}");
            }
        }
        assert_eq!(GgmlType::Q5_1.row_bytes(64), Some(48));
        assert_eq!(GgmlType::Q8_0.row_bytes(48), None);
        assert_eq!(GgmlType::Q4_0.values_in(36), Some(64));
    }
}
