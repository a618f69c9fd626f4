//! kvfast-core's plain tables as Arrow: one conversion for every table kvfast hands out.
//!
//! `kind` becomes a dictionary of u8 keys over ["k", "v", "r", "s"] with Polars' enumeration
//! metadata, so Polars reads `Enum(["k", "v", "r", "s"])` (one type for every state: frames concat
//! and join), pyarrow a dictionary, DuckDB text.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use arrow_array::types::UInt8Type;
use arrow_array::{
    ArrayRef, DictionaryArray, PrimitiveArray, RecordBatch, StringArray, UInt8Array,
};
use arrow_buffer::{NullBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use kvfast_core::plan::columns::{Column, Table, Values};
use kvfast_core::Kind;

/// The kinds in the enumeration's order.
const KINDS: [&str; 4] = ["k", "v", "r", "s"];

fn kind_key(k: Kind) -> u8 {
    match k {
        Kind::K => 0,
        Kind::V => 1,
        Kind::R => 2,
        Kind::S => 3,
    }
}

/// The `kind` field: a dictionary Polars reads as Enum(["k", "v", "r", "s"]).
pub fn kind_field(name: &str) -> Field {
    let dt = DataType::Dictionary(Box::new(DataType::UInt8), Box::new(DataType::Utf8));
    let meta: HashMap<String, String> = [(
        "_PL_ENUM_VALUES2".to_string(),
        KINDS.iter().map(|k| format!("{};{k}", k.len())).collect(),
    )]
    .into();
    Field::new(name, dt, false).with_metadata(meta)
}

fn kind_values() -> Arc<StringArray> {
    static V: OnceLock<Arc<StringArray>> = OnceLock::new();
    V.get_or_init(|| Arc::new(StringArray::from(KINDS.to_vec())))
        .clone()
}

/// A kind column of these kinds.
pub fn kind_array(kinds: &[Kind]) -> ArrayRef {
    let keys = UInt8Array::from(kinds.iter().map(|k| kind_key(*k)).collect::<Vec<_>>());
    Arc::new(DictionaryArray::<UInt8Type>::new(keys, kind_values()))
}

fn primitive<T: arrow_array::ArrowPrimitiveType>(
    v: Vec<T::Native>,
    valid: Option<Vec<bool>>,
) -> ArrayRef {
    Arc::new(PrimitiveArray::<T>::new(
        ScalarBuffer::from(v),
        valid.map(NullBuffer::from),
    ))
}

fn array(values: Values, valid: Option<Vec<bool>>) -> ArrayRef {
    use arrow_array::types::*;
    match values {
        Values::U8(v) => primitive::<UInt8Type>(v, valid),
        Values::U16(v) => primitive::<UInt16Type>(v, valid),
        Values::U32(v) => primitive::<UInt32Type>(v, valid),
        Values::I32(v) => primitive::<Int32Type>(v, valid),
        Values::U64(v) => primitive::<UInt64Type>(v, valid),
        Values::F32(v) => primitive::<Float32Type>(v, valid),
        Values::F64(v) => primitive::<Float64Type>(v, valid),
        Values::Kind(v) => kind_array(&v),
        Values::Str(v) => Arc::new(StringArray::from(v)),
    }
}

/// A column as an array (its vectors moved, not copied) and its field.
fn column(c: Column) -> (Field, ArrayRef) {
    let Column {
        name,
        values,
        valid,
        nullable,
    } = c;
    let kind = matches!(values, Values::Kind(_));
    let a = array(values, valid);
    let f = if kind {
        kind_field(name)
    } else {
        Field::new(name, a.data_type().clone(), nullable)
    };
    (f, a)
}

/// The arrays of a table, and its schema.
pub fn arrays(t: Table) -> (Vec<Field>, Vec<ArrayRef>) {
    t.columns.into_iter().map(column).unzip()
}

/// A table as one record batch.
pub fn batch(t: Table) -> RecordBatch {
    let (fields, arrays) = arrays(t);
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).expect("columns of equal length")
}

/// Tables of one schema as batches, and that schema (none: no batch, the empty schema of no
/// columns).
pub fn batches(tables: Vec<Table>) -> (SchemaRef, Vec<RecordBatch>) {
    let batches: Vec<RecordBatch> = tables.into_iter().map(batch).collect();
    let schema: SchemaRef = match batches.first() {
        None => Arc::new(Schema::empty()),
        Some(b) => b.schema(),
    };
    (schema, batches)
}
