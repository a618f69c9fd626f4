//! The columns of the tables kvfast hands out, as plain vectors (the binding makes them Arrow).
//!
//! The index columns' types are decided here, once, as narrow as the walk's bounds allow:
//! cache < 8 and stream < 256 (u8), layer and model layer < 4096 (u16), head < 65,536 (u16: the
//! planner refuses a head size that makes more), channel (u32: a recurrent S row has 655,360
//! values in Mamba 2 2.7B), cell (u32), position (i32, llama.cpp's llama_pos), sequence < 256
//! (u8, LLAMA_MAX_SEQ), kind one of k, v, r, s (an enumeration). [`INDEX`] lists them: every
//! table's index column is pushed as its type there (checked as it is pushed, in debug builds),
//! and Python's `kvfast.read.schema.INDEX` is read from it.

use crate::format::layout::Kind;
use crate::plan::select::Job;

/// The type of an index column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexType {
    /// Text (a state's name, its path: the columns scans and exports add).
    Str,
    U8,
    U16,
    U32,
    I32,
    /// k, v, r or s.
    Kind,
}

impl IndexType {
    pub fn name(self) -> &'static str {
        match self {
            IndexType::Str => "string",
            IndexType::U8 => "uint8",
            IndexType::U16 => "uint16",
            IndexType::U32 => "uint32",
            IndexType::I32 => "int32",
            IndexType::Kind => "kind",
        }
    }

    fn holds(self, values: &Values) -> bool {
        matches!(
            (self, values),
            (IndexType::Str, Values::Str(_))
                | (IndexType::U8, Values::U8(_))
                | (IndexType::U16, Values::U16(_))
                | (IndexType::U32, Values::U32(_))
                | (IndexType::I32, Values::I32(_))
                | (IndexType::Kind, Values::Kind(_))
        )
    }
}

/// Every index column of the tables kvfast hands out, and its type: the one definition.
pub const INDEX: [(&str, IndexType); 12] = [
    ("dump", IndexType::Str),
    ("path", IndexType::Str),
    ("cache", IndexType::U8),
    ("stream", IndexType::U8),
    ("layer", IndexType::U16),
    ("model_layer", IndexType::U16),
    ("kind", IndexType::Kind),
    ("cell", IndexType::U32),
    ("pos", IndexType::I32),
    ("seq_id", IndexType::U8),
    ("head", IndexType::U16),
    ("channel", IndexType::U32),
];

/// The type of index column `name` (None: not an index column).
pub fn index_type(name: &str) -> Option<IndexType> {
    INDEX.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// One column's values.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    /// k, v, r or s.
    Kind(Vec<Kind>),
    /// Short names (a ggml type's).
    Str(Vec<&'static str>),
}

impl Values {
    pub fn len(&self) -> usize {
        match self {
            Values::U8(v) => v.len(),
            Values::U16(v) => v.len(),
            Values::U32(v) => v.len(),
            Values::I32(v) => v.len(),
            Values::U64(v) => v.len(),
            Values::F32(v) => v.len(),
            Values::F64(v) => v.len(),
            Values::Kind(v) => v.len(),
            Values::Str(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A named column; `valid` marks the non-null entries (None: every entry is valid); `nullable`
/// whether the column's type allows nulls at all (whatever this table holds).
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    pub name: &'static str,
    pub values: Values,
    pub valid: Option<Vec<bool>>,
    pub nullable: bool,
}

/// Columns of equal length, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    pub columns: Vec<Column>,
}

fn split<T: Default + Copy>(v: Vec<Option<T>>) -> (Vec<T>, Option<Vec<bool>>) {
    // no validity at all where every entry is there (the usual case: no vector to build)
    let valid = (!v.iter().all(Option::is_some)).then(|| v.iter().map(Option::is_some).collect());
    let values = v.into_iter().map(Option::unwrap_or_default).collect();
    (values, valid)
}

impl Table {
    fn add(&mut self, column: Column) {
        debug_assert!(
            index_type(column.name).is_none_or(|t| t.holds(&column.values)),
            "index column {} pushed as {:?}, not as INDEX says",
            column.name,
            std::mem::discriminant(&column.values)
        );
        self.columns.push(column);
    }

    pub fn push(&mut self, name: &'static str, values: Values) {
        self.add(Column {
            name,
            values,
            valid: None,
            nullable: false,
        });
    }

    pub fn push_opt_u8(&mut self, name: &'static str, v: Vec<Option<u8>>) {
        let (values, valid) = split(v);
        self.add(Column {
            name,
            values: Values::U8(values),
            valid,
            nullable: true,
        });
    }

    pub fn push_opt_u16(&mut self, name: &'static str, v: Vec<Option<u16>>) {
        let (values, valid) = split(v);
        self.add(Column {
            name,
            values: Values::U16(values),
            valid,
            nullable: true,
        });
    }

    pub fn push_opt_u32(&mut self, name: &'static str, v: Vec<Option<u32>>) {
        let (values, valid) = split(v);
        self.add(Column {
            name,
            values: Values::U32(values),
            valid,
            nullable: true,
        });
    }

    /// Rows (the first column's length; 0 without columns).
    pub fn rows(&self) -> usize {
        self.columns.first().map_or(0, |c| c.values.len())
    }
}

/// A cache's index (< MAX_CACHES).
pub fn cache(c: u32) -> u8 {
    c as u8
}

/// A stream's index (< MAX_SEQ).
pub fn stream(s: u32) -> u8 {
    s as u8
}

/// A cache layer or model layer (< MAX_LAYERS).
pub fn layer(l: u32) -> u16 {
    l as u16
}

/// A model layer from the layer map (None: not known, or out of the column's range).
pub fn model_layer(l: Option<i32>) -> Option<u16> {
    l.and_then(|l| u16::try_from(l).ok())
}

/// A sequence id (0 to MAX_SEQ - 1: the walk refuses others).
pub fn seq(q: Option<i32>) -> Option<u8> {
    q.and_then(|q| u8::try_from(q).ok())
}

/// The (cache, layer, model_layer, kind) columns of a table with rows per record.
#[derive(Debug, Default)]
pub struct Keys {
    pub cache: Vec<u8>,
    pub layer: Vec<u16>,
    pub model_layer: Vec<Option<u16>>,
    pub kind: Vec<Kind>,
}

impl Keys {
    /// `n` rows of one record's keys.
    pub fn extend(
        &mut self,
        cache_: u32,
        layer_: u32,
        model_layer_: Option<i32>,
        kind: Kind,
        n: usize,
    ) {
        self.cache.extend(std::iter::repeat_n(cache(cache_), n));
        self.layer.extend(std::iter::repeat_n(layer(layer_), n));
        self.model_layer
            .extend(std::iter::repeat_n(model_layer(model_layer_), n));
        self.kind.extend(std::iter::repeat_n(kind, n));
    }

    /// cache, then `between` (the stream column of per-cell tables), then layer, model_layer, kind.
    pub fn write(self, out: &mut Table, between: Option<Vec<u8>>) {
        out.push("cache", Values::U8(self.cache));
        if let Some(s) = between {
            out.push("stream", Values::U8(s));
        }
        out.push("layer", Values::U16(self.layer));
        out.push_opt_u16("model_layer", self.model_layer);
        out.push("kind", Values::Kind(self.kind));
    }
}

/// The index columns of the value table for one record: cache, stream, layer, model_layer, kind,
/// cell, pos, seq_id, head; a row per (cell, sequence) pair and head.
pub fn value_index(
    job: &Job,
    pairs: &[(usize, Option<i32>)],
    heads: &[u32],
    model_layer_: Option<i32>,
) -> Table {
    let s = job.stream;
    let n = pairs.len() * heads.len();
    let mut keys = Keys::default();
    keys.extend(job.cache, job.layer, model_layer_, job.kind, n);
    let mut t = Table::default();
    keys.write(&mut t, Some(vec![stream(s.index); n]));
    let (mut cell, mut pos, mut sq, mut head) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let heads16: Vec<u16> = heads.iter().map(|&h| h as u16).collect();
    let k = heads.len();
    for &(c, q) in pairs {
        cell.extend(std::iter::repeat_n(c as u32, k));
        pos.extend(std::iter::repeat_n(s.pos[c], k));
        sq.extend(std::iter::repeat_n(seq(q), k));
        head.extend_from_slice(&heads16);
    }
    t.push("cell", Values::U32(cell));
    t.push("pos", Values::I32(pos));
    t.push_opt_u8("seq_id", sq);
    t.push("head", Values::U16(head));
    t
}

/// The value table's index columns with no row.
pub fn empty_value_index() -> Table {
    let mut t = Table::default();
    Keys::default().write(&mut t, Some(vec![]));
    t.push("cell", Values::U32(vec![]));
    t.push("pos", Values::I32(vec![]));
    t.push_opt_u8("seq_id", vec![]);
    t.push("head", Values::U16(vec![]));
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_is_defined_once_and_tables_follow_it() {
        let names: Vec<&str> = INDEX.iter().map(|(n, _)| *n).collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
        assert_eq!(index_type("seq_id"), Some(IndexType::U8));
        assert_eq!(index_type("values"), None);
        let t = empty_value_index();
        for c in &t.columns {
            let ty = index_type(c.name).expect("the value index holds index columns only");
            assert!(ty.holds(&c.values), "{}", c.name);
        }
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "index column layer pushed as")]
    fn an_index_column_of_another_type_is_caught() {
        Table::default().push("layer", Values::U32(vec![1]));
    }

    #[test]
    fn keys_and_nulls() {
        let mut k = Keys::default();
        k.extend(1, 300, Some(7), Kind::V, 2);
        k.extend(0, 1, None, Kind::K, 1);
        let mut t = Table::default();
        k.write(&mut t, Some(vec![0, 0, 3]));
        assert_eq!(t.rows(), 3);
        let names: Vec<_> = t.columns.iter().map(|c| c.name).collect();
        assert_eq!(names, ["cache", "stream", "layer", "model_layer", "kind"]);
        assert_eq!(t.columns[2].values, Values::U16(vec![300, 300, 1]));
        assert_eq!(t.columns[3].values, Values::U16(vec![7, 7, 0]));
        assert_eq!(t.columns[3].valid, Some(vec![true, true, false]));
        assert_eq!(t.columns[0].valid, None);
        assert_eq!(seq(Some(255)), Some(255));
        assert_eq!(seq(Some(256)), None);
        assert_eq!(model_layer(Some(-1)), None);
    }
}
