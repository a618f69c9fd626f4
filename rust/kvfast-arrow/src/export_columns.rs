//! The columns an export adds to the value table, written in the same pass as the rest: `k_type`
//! and `v_type`, the ggml types of the row's layer's K and V records (one value a record), and
//! `token` and `piece`, the token its cell holds and its text, looked up by (cache, stream, cell)
//! in a per-stream array of the state's cells (Python's `cell_tokens` mapping, handed over once
//! per state) and a dictionary of its pieces: memory of the cells, not of the rows.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    ArrowDictionaryKeyType, Int16Type, Int32Type, Int8Type, UInt16Type, UInt32Type, UInt8Type,
};
use arrow_array::{
    ArrayRef, DictionaryArray, Int32Array, LargeStringArray, PrimitiveArray, RecordBatch,
    StringArray, StringViewArray,
};
use arrow_schema::DataType;
use kvfast_core::format::types::ALL_TYPES;
use kvfast_core::{GgmlType, Kind, Layout};
use parquet::errors::ParquetError;

/// The ggml types of layer `layer`'s K and V records in cache `cache` (the first stream holding
/// the layer; every stream of a cache has the same types): None where it has none (an MLA
/// cache's V, a layer or cache not there), and both None for the recurrent part (its R and S
/// are not the K and V caches).
pub fn layer_types(
    layout: &Layout,
    cache: u32,
    layer: u32,
) -> (Option<GgmlType>, Option<GgmlType>) {
    let Some(c) = layout.caches.get(cache as usize) else {
        return (None, None);
    };
    if c.memory.is_recurrent() {
        return (None, None);
    }
    let Some(ly) = c.streams.iter().find_map(|s| s.layers.get(layer as usize)) else {
        return (None, None);
    };
    let ty = |k| ly.record(k).map(|r| r.ty);
    (ty(Kind::K), ty(Kind::V))
}

/// The token each cell of a state holds and its piece's index in `pieces`, by (cache, stream)
/// and cell (negative: not known). A cell of no entry (the recurrent part's) has neither.
#[derive(Debug, Default, Clone)]
pub struct CellTokens {
    pub cells: HashMap<(u8, u8), Vec<(i32, i32)>>,
    pub pieces: Vec<String>,
}

impl CellTokens {
    fn of(&self, cache: u8, stream: u8, cell: u32) -> (i32, i32) {
        self.cells
            .get(&(cache, stream))
            .and_then(|v| v.get(cell as usize))
            .copied()
            .unwrap_or((-1, -1))
    }

    /// The `token` and `piece` columns of a batch of the value table (its cache, stream and cell
    /// columns), `piece` of the file's string type `piece_ty`.
    pub fn columns(
        &self,
        batch: &RecordBatch,
        piece_ty: &DataType,
    ) -> Result<(ArrayRef, ArrayRef), ParquetError> {
        let col = |name: &str| {
            batch.column_by_name(name).ok_or_else(|| {
                ParquetError::General(format!("the value table has no column {name}"))
            })
        };
        let (cache, stream, cell) = (col("cache")?, col("stream")?, col("cell")?);
        let bad = |name: &str| ParquetError::General(format!("column {name} is not of its type"));
        let cache = cache
            .as_primitive_opt::<UInt8Type>()
            .ok_or_else(|| bad("cache"))?;
        let stream = stream
            .as_primitive_opt::<UInt8Type>()
            .ok_or_else(|| bad("stream"))?;
        let cell = cell
            .as_primitive_opt::<UInt32Type>()
            .ok_or_else(|| bad("cell"))?;
        let found: Vec<(i32, i32)> = (0..batch.num_rows())
            .map(|i| self.of(cache.value(i), stream.value(i), cell.value(i)))
            .collect();
        let token = Int32Array::from_iter(found.iter().map(|&(t, _)| (t >= 0).then_some(t)));
        let words: Vec<&str> = self.pieces.iter().map(String::as_str).collect();
        let keys: Vec<Option<usize>> = found
            .iter()
            .map(|&(_, p)| usize::try_from(p).ok().filter(|&p| p < words.len()))
            .collect();
        Ok((Arc::new(token), text(piece_ty, &words, &keys)?))
    }
}

/// A `k_type`/`v_type` column of `n` rows holding `t` (None: null), of the file's type `ty`: a
/// dictionary over every ggml type kvfast knows, in kvfast-core's order (Polars' Enum), or text.
pub fn type_column(ty: &DataType, t: Option<GgmlType>, n: usize) -> Result<ArrayRef, ParquetError> {
    let names: Vec<&str> = ALL_TYPES.iter().map(|t| t.name()).collect();
    let key = t.and_then(|t| ALL_TYPES.iter().position(|a| *a == t));
    text(ty, &names, &vec![key; n])
}

/// A text column of `ty` (a string layout, or a dictionary of any integer keys over one):
/// `words[k]` for each key, null for None.
pub fn text(
    ty: &DataType,
    words: &[&str],
    keys: &[Option<usize>],
) -> Result<ArrayRef, ParquetError> {
    match ty {
        DataType::Dictionary(k, v) => {
            let all: Vec<Option<usize>> = (0..words.len()).map(Some).collect();
            let values = text(v, words, &all)?;
            match k.as_ref() {
                DataType::UInt8 => dictionary::<UInt8Type>(keys, values),
                DataType::UInt16 => dictionary::<UInt16Type>(keys, values),
                DataType::UInt32 => dictionary::<UInt32Type>(keys, values),
                DataType::Int8 => dictionary::<Int8Type>(keys, values),
                DataType::Int16 => dictionary::<Int16Type>(keys, values),
                DataType::Int32 => dictionary::<Int32Type>(keys, values),
                k => Err(ParquetError::General(format!(
                    "dictionary keys of type {k}"
                ))),
            }
        }
        _ => {
            let each = keys.iter().map(|k| k.map(|k| words[k]));
            Ok(match ty {
                DataType::Utf8 => Arc::new(StringArray::from_iter(each)),
                DataType::LargeUtf8 => Arc::new(LargeStringArray::from_iter(each)),
                DataType::Utf8View => Arc::new(StringViewArray::from_iter(each)),
                t => return Err(ParquetError::General(format!("a text column of type {t}"))),
            })
        }
    }
}

fn dictionary<K: ArrowDictionaryKeyType>(
    keys: &[Option<usize>],
    values: ArrayRef,
) -> Result<ArrayRef, ParquetError>
where
    K::Native: TryFrom<usize>,
{
    let keys: PrimitiveArray<K> = keys
        .iter()
        .map(|k| k.and_then(|k| K::Native::try_from(k).ok()))
        .collect();
    Ok(Arc::new(DictionaryArray::<K>::try_new(keys, values)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Array, UInt32Array, UInt8Array};
    use arrow_schema::{Field, Schema};

    #[test]
    fn a_type_column_is_a_dictionary_over_every_type_or_null() {
        let ty = DataType::Dictionary(Box::new(DataType::UInt8), Box::new(DataType::LargeUtf8));
        let c = type_column(&ty, Some(GgmlType::Q8_0), 3).unwrap();
        let d = c.as_dictionary::<UInt8Type>();
        assert_eq!(d.values().len(), ALL_TYPES.len());
        assert_eq!(d.keys().values().to_vec(), vec![3, 3, 3]); // f32, f16, bf16, q8_0
        let none = type_column(&ty, None, 2).unwrap();
        assert_eq!(none.null_count(), 2);
        let plain = type_column(&DataType::Utf8View, Some(GgmlType::F16), 1).unwrap();
        assert_eq!(plain.as_string_view().value(0), "f16");
    }

    #[test]
    fn tokens_and_pieces_by_cell_null_where_not_known() {
        let toks = CellTokens {
            cells: [((0, 1), vec![(7, 1), (9, -1)])].into(),
            pieces: vec!["a".into(), "b".into()],
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("cache", DataType::UInt8, false),
            Field::new("stream", DataType::UInt8, false),
            Field::new("cell", DataType::UInt32, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(UInt8Array::from(vec![0, 0, 0, 1])),
                Arc::new(UInt8Array::from(vec![1, 1, 1, 1])),
                Arc::new(UInt32Array::from(vec![0, 1, 2, 0])),
            ],
        )
        .unwrap();
        let (token, piece) = toks.columns(&batch, &DataType::LargeUtf8).unwrap();
        let token = token.as_primitive::<Int32Type>();
        let got: Vec<Option<i32>> = token.iter().collect();
        assert_eq!(got, vec![Some(7), Some(9), None, None]);
        let piece: Vec<Option<&str>> = piece.as_string::<i64>().iter().collect();
        assert_eq!(piece, vec![Some("b"), None, None, None]);
    }
}
