//! Building one Arrow record batch from named columns.

use std::sync::Arc;

use arrow_array::{
    ArrayRef, Float32Array, Float64Array, Int32Array, RecordBatch, UInt32Array, UInt64Array,
};
use arrow_schema::{Field, Schema};

use crate::stream::ArrowStream;
use crate::table::{optional_i32, repeated_str};

#[derive(Default)]
pub struct Columns {
    fields: Vec<Field>,
    arrays: Vec<ArrayRef>,
}

impl Columns {
    fn push(&mut self, name: &str, a: ArrayRef) {
        self.fields
            .push(Field::new(name, a.data_type().clone(), true));
        self.arrays.push(a);
    }

    pub fn i32(&mut self, name: &str, v: Vec<i32>) {
        self.push(name, Arc::new(Int32Array::from(v)));
    }

    pub fn opt_i32(&mut self, name: &str, v: Vec<Option<i32>>) {
        self.push(name, Arc::new(optional_i32(v)));
    }

    pub fn u32(&mut self, name: &str, v: Vec<u32>) {
        self.push(name, Arc::new(UInt32Array::from(v)));
    }

    pub fn u64(&mut self, name: &str, v: Vec<u64>) {
        self.push(name, Arc::new(UInt64Array::from(v)));
    }

    pub fn f64(&mut self, name: &str, v: Vec<f64>) {
        self.push(name, Arc::new(Float64Array::from(v)));
    }

    pub fn f32(&mut self, name: &str, v: Vec<f32>) {
        self.push(name, Arc::new(Float32Array::from(v)));
    }

    /// A column of one-byte kinds ('k' / 'v').
    pub fn kind(&mut self, name: &str, v: &[&'static str]) {
        let a = match v.first() {
            Some(k) if v.iter().all(|x| x == k) => repeated_str(k, v.len()),
            _ => arrow_array::StringArray::from(v.to_vec()),
        };
        self.push(name, Arc::new(a));
    }

    /// The columns as one record batch.
    pub fn batch(self) -> RecordBatch {
        let schema = Arc::new(Schema::new(self.fields));
        RecordBatch::try_new(schema, self.arrays).expect("columns of equal length")
    }

    pub fn finish(self) -> ArrowStream {
        let schema = Arc::new(Schema::new(self.fields));
        let batch =
            RecordBatch::try_new(schema.clone(), self.arrays).expect("columns of equal length");
        ArrowStream {
            schema,
            batches: vec![batch],
        }
    }
}
