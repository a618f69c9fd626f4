//! The value table written as Parquet for `kvfast.export`: each partition a file ([`write_part`];
//! the binding writes the partitions in parallel, the GIL released); one row group per record (per
//! stream of it, or per `row_group_bytes` of its values), so memory holds one row group per
//! worker, never a state.
//!
//! The batches are [`crate::table`]'s (the same plan as `State.table`). The index columns go through
//! arrow-rs's column writers; the values column is encoded here: arrow-rs writes a Float16 value
//! as a byte array of its own (a slice object per two bytes, tens of MB/s), while a
//! `fixed_size_list` column without nulls is a fixed pattern of levels (a run of one 0 and
//! `head_dim - 1` ones per row, one run of the maximum definition) and the values' bytes (PLAIN) or
//! their bytes split in planes (BYTE_STREAM_SPLIT). The files hold the same schema (Arrow's, in
//! the `ARROW:schema` metadata, and Parquet's: FLOAT16 or FLOAT elements of an optional list) as
//! the Polars frames written before, so every reader sees the same table.
//!
//! The columns an export adds to the value table are written in the same pass: `dump` and `path`
//! (one value a call), `k_type` and `v_type` (one a record), `token` and `piece` (by cell:
//! [`crate::export_columns`]).

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{
    Array, ArrayRef, FixedSizeListArray, Float16Array, Float32Array, LargeStringArray, RecordBatch,
    StringArray, StringViewArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use kvfast_core::model::layer_map::LayerMap;
use kvfast_core::plan::select::Selection;
use kvfast_core::plan::table_plan::Dtype;
use kvfast_core::{GgmlType, State};
use parquet::arrow::arrow_writer::{compute_leaves, ArrowRowGroupWriterFactory};
use parquet::arrow::{add_encoded_arrow_schema_to_metadata, ArrowSchemaConverter};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::ParquetError;
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::file::writer::{SerializedFileWriter, SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;

use crate::error::{Error, Result};
use crate::export_columns::{type_column, CellTokens};
use crate::table::{each_batch, TableRequest, VALUES};

/// How the values column is written (export's choice is the default; the benchmark tries others).
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// zstd level of the values' pages (None: uncompressed; the index columns are zstd level 1).
    pub zstd: Option<i32>,
    /// BYTE_STREAM_SPLIT instead of PLAIN for the values.
    pub split: bool,
    /// About how many bytes of values a page holds (whole rows, at least one).
    pub page_bytes: usize,
    /// The most bytes of a record's rows in one row group (a longer record is several).
    pub row_group_bytes: usize,
}

/// One record of a partition: its selection (cache, layer, kind), its bytes in the state (for
/// progress), and the ggml types of its layer's K and V records (the `k_type` and `v_type`
/// columns; None: the layer has no such record, as an MLA cache's V or the recurrent part's).
pub struct Rec {
    pub sel: Selection,
    pub nbytes: u64,
    pub k_type: Option<GgmlType>,
    pub v_type: Option<GgmlType>,
}

/// One partition: its file, its records, the values' type.
pub struct Part {
    pub dest: PathBuf,
    pub records: Vec<Rec>,
    pub dtype: Dtype,
}

/// What every partition of a call shares.
pub struct Shared<'a> {
    pub sf: &'a State,
    /// The model's own layer index of each cache's layers (the `model_layer` column).
    pub model_layers: LayerMap,
    pub seq_default: Option<i32>,
    /// The `dump` and `path` columns' one value.
    pub dump: &'a str,
    pub path: &'a str,
    /// The `token` and `piece` columns' values by cell.
    pub tokens: &'a CellTokens,
    /// The index columns' types as the file holds them (dump and path first; Python's schema).
    pub index: SchemaRef,
    pub settings: Settings,
}

fn os_error(dest: &Path, e: impl std::fmt::Display) -> Error {
    Error::Write {
        path: dest.to_path_buf(),
        message: e.to_string(),
    }
}

/// A zstd level the writer takes (else the writer's refusal).
pub fn check_zstd(level: i32) -> Result<()> {
    ZstdLevel::try_new(level)?;
    Ok(())
}

/// Write `part`'s records to its file (folders made as needed; no file for a partition of no
/// record), calling `advance(nbytes)` after each record with its bytes in the state (its error
/// stops the write). Returns the rows written and the values' type ("float16" or "float32"; None
/// when no file was written).
pub fn write_part<E: From<Error>>(
    sh: &Shared<'_>,
    part: &Part,
    advance: impl Fn(u64) -> std::result::Result<(), E>,
) -> std::result::Result<(u64, Option<&'static str>), E> {
    if part.records.is_empty() {
        return Ok((0, None));
    }
    let dest = &part.dest;
    if let Some(dir) = dest.parent() {
        std::fs::create_dir_all(dir).map_err(|e| os_error(dest, e))?;
    }
    let mut file = Some(File::create(dest).map_err(|e| os_error(dest, e))?);
    let mut out: Option<FileOut> = None;
    let mut rows = 0u64;
    for rec in &part.records {
        let req = TableRequest {
            sel: rec.sel.clone(),
            dtype: part.dtype,
            model_layers: sh.model_layers.clone(),
            with_values: true,
            ragged: false,
        };
        // a row group per record, or per `row_group_bytes` of its values, decoded a group at a
        // time: what a worker holds is bounded by a row group, not a record
        each_batch::<E>(
            sh.sf,
            &req,
            sh.seq_default,
            sh.settings.row_group_bytes,
            |b| {
                let o = match &mut out {
                    Some(o) => o,
                    None => out.insert(FileOut::new(
                        file.take().expect("one file"),
                        &sh.index,
                        b.schema_ref(),
                        sh.settings,
                    )?),
                };
                if b.schema_ref().field(VALUES).data_type() != &o.table_values {
                    // a usage error, not the file's
                    return Err(Error::MixedValues {
                        path: dest.clone(),
                        first: o.table_values.clone(),
                        other: b.schema_ref().field(VALUES).data_type().clone(),
                    }
                    .into());
                }
                if b.num_rows() > 0 {
                    rows += o.write(&b, sh, rec).map_err(|e| os_error(dest, e))? as u64;
                }
                Ok(())
            },
        )?;
        advance(rec.nbytes)?;
    }
    let o = out.expect("a record was written");
    let values = o.values_name();
    o.w.close().map_err(|e| os_error(dest, e))?;
    Ok((rows, Some(values)))
}

/// An open Parquet file of the value table.
struct FileOut {
    w: SerializedFileWriter<BufWriter<File>>,
    factory: ArrowRowGroupWriterFactory,
    schema: SchemaRef,
    values: ColumnDescPtr,
    settings: Settings,
    row_groups: usize,
    /// The values column's type in the value table's schema (every record of the file has it).
    table_values: DataType,
}

/// The file's schema: the index columns as Python gives them (what Polars writes from the same
/// frame: every field nullable, its metadata kept), then the values, items named `element` (as
/// pyarrow names them).
fn file_schema(index: &Schema, table: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = index.fields().iter().map(|f| f.as_ref().clone()).collect();
    if let DataType::FixedSizeList(item, n) = table.field(VALUES).data_type() {
        let item = Field::new("element", item.data_type().clone(), true);
        fields.push(Field::new(
            "values",
            DataType::FixedSizeList(Arc::new(item), *n),
            true,
        ));
    }
    Arc::new(Schema::new_with_metadata(fields, index.metadata().clone()))
}

impl FileOut {
    fn new(file: File, index: &Schema, table: &Schema, settings: Settings) -> Result<Self> {
        let schema = file_schema(index, table);
        // the index columns: zstd level 1 always (small after dictionary encoding, cheap to squeeze)
        let compression = Compression::ZSTD(ZstdLevel::try_new(1).map_err(pq)?);
        let mut props = WriterProperties::builder()
            .set_writer_version(WriterVersion::PARQUET_1_0)
            .set_compression(compression)
            .set_statistics_enabled(EnabledStatistics::Chunk)
            .set_offset_index_disabled(true)
            .set_max_row_group_row_count(None)
            .build();
        add_encoded_arrow_schema_to_metadata(&schema, &mut props);
        let descr = ArrowSchemaConverter::new()
            .with_coerce_types(props.coerce_types())
            .convert(&schema)
            .map_err(pq)?;
        let values = descr.column(descr.num_columns() - 1);
        let w = SerializedFileWriter::new(
            BufWriter::with_capacity(1 << 20, file),
            descr.root_schema_ptr(),
            Arc::new(props),
        )
        .map_err(pq)?;
        let factory = ArrowRowGroupWriterFactory::new(&w, schema.clone());
        Ok(FileOut {
            w,
            factory,
            schema,
            values,
            settings,
            row_groups: 0,
            table_values: table.field(VALUES).data_type().clone(),
        })
    }

    fn values_name(&self) -> &'static str {
        match &self.table_values {
            DataType::FixedSizeList(item, _) if item.data_type() == &DataType::Float16 => "float16",
            _ => "float32",
        }
    }

    /// One row group of `batch` (the value table's columns of `rec`); the rows written.
    fn write(
        &mut self,
        batch: &RecordBatch,
        sh: &Shared<'_>,
        rec: &Rec,
    ) -> std::result::Result<usize, ParquetError> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(0);
        }
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        let mut tokens: Option<(ArrayRef, ArrayRef)> = None;
        for f in self.schema.fields() {
            columns.push(match f.name().as_str() {
                "dump" => strings(f.data_type(), &[sh.dump], &vec![0; n])?,
                "path" => strings(f.data_type(), &[sh.path], &vec![0; n])?,
                "k_type" => type_column(f.data_type(), rec.k_type, n)?,
                "v_type" => type_column(f.data_type(), rec.v_type, n)?,
                name @ ("token" | "piece") => {
                    let (token, piece) = match &tokens {
                        Some(t) => t.clone(),
                        None => {
                            let ty = self
                                .schema
                                .field_with_name("piece")
                                .map(|p| p.data_type().clone())
                                .unwrap_or(DataType::Utf8);
                            tokens.insert(sh.tokens.columns(batch, &ty)?).clone()
                        }
                    };
                    if name == "token" {
                        token
                    } else {
                        piece
                    }
                }
                name => {
                    let c = batch.column_by_name(name).ok_or_else(|| {
                        ParquetError::General(format!("the value table has no column {name}"))
                    })?;
                    adapt(name, c, f.data_type())?
                }
            });
        }
        let writers = self.factory.create_column_writers(self.row_groups)?;
        let mut rg = self.w.next_row_group()?;
        let last = self.schema.fields().len() - 1;
        for ((field, col), mut cw) in self
            .schema
            .fields()
            .iter()
            .zip(&columns)
            .zip(writers)
            .take(last)
        {
            for leaf in compute_leaves(field, col)? {
                cw.write(&leaf)?;
            }
            cw.close()?.append_to_row_group(&mut rg)?;
        }
        let list = columns[last]
            .as_any()
            .downcast_ref::<FixedSizeListArray>()
            .ok_or_else(|| ParquetError::General("values are not a fixed-size list".into()))?;
        let (chunk, close) = encode_values(&self.values, list, self.settings)?;
        rg.append_column(&chunk, close)?;
        rg.close()?;
        self.row_groups += 1;
        Ok(n)
    }
}

fn pq(e: ParquetError) -> Error {
    Error::Parquet(e)
}

/// A string column of `ty` (Utf8, LargeUtf8 or Utf8View): `values[k]` for each `k` of `keys`.
fn strings(
    ty: &DataType,
    values: &[&str],
    keys: &[usize],
) -> std::result::Result<ArrayRef, ParquetError> {
    let each = keys.iter().map(|&k| values[k]);
    Ok(match ty {
        DataType::Utf8 => Arc::new(StringArray::from_iter_values(each)),
        DataType::LargeUtf8 => Arc::new(LargeStringArray::from_iter_values(each)),
        DataType::Utf8View => Arc::new(StringViewArray::from_iter_values(each)),
        t => {
            return Err(ParquetError::General(format!(
                "a string column of type {t}"
            )))
        }
    })
}

/// The strings of a string array of any of the three layouts (no null expected).
fn string_values(a: &dyn Array) -> Option<Vec<&str>> {
    let v = a.as_any();
    if let Some(s) = v.downcast_ref::<StringArray>() {
        Some(s.iter().map(|x| x.unwrap_or("")).collect())
    } else if let Some(s) = v.downcast_ref::<LargeStringArray>() {
        Some(s.iter().map(|x| x.unwrap_or("")).collect())
    } else {
        v.downcast_ref::<StringViewArray>()
            .map(|s| s.iter().map(|x| x.unwrap_or("")).collect())
    }
}

/// Column `name` of the value table as the file's type `ty` says: itself when alike, the values'
/// items renamed, strings in another layout (a dictionary's too, its keys kept).
fn adapt(name: &str, c: &ArrayRef, ty: &DataType) -> std::result::Result<ArrayRef, ParquetError> {
    if c.data_type() == ty {
        return Ok(c.clone());
    }
    let refuse = || {
        ParquetError::General(format!(
            "column {name} is {} in the value table, {ty} in the export's schema",
            c.data_type()
        ))
    };
    match (c.data_type(), ty) {
        (DataType::FixedSizeList(a, n), DataType::FixedSizeList(b, m))
            if n == m && a.data_type() == b.data_type() =>
        {
            let list = c
                .as_any()
                .downcast_ref::<FixedSizeListArray>()
                .ok_or_else(refuse)?;
            Ok(Arc::new(FixedSizeListArray::try_new(
                b.clone(),
                *m,
                list.values().clone(),
                list.nulls().cloned(),
            )?))
        }
        (DataType::Dictionary(ka, _), DataType::Dictionary(kb, vb)) if ka == kb => {
            let d = c.as_any_dictionary_opt().ok_or_else(refuse)?;
            let words = string_values(d.values().as_ref()).ok_or_else(refuse)?;
            let values = strings(vb, &words, &(0..words.len()).collect::<Vec<_>>())?;
            Ok(d.with_values(values))
        }
        (_, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => {
            let words = string_values(c.as_ref()).ok_or_else(refuse)?;
            strings(ty, &words, &(0..words.len()).collect::<Vec<_>>())
        }
        _ => Err(refuse()),
    }
}

/// The values' bytes of a fixed-size list of f16 or f32 without nulls, and their width.
fn value_bytes(list: &FixedSizeListArray) -> std::result::Result<(&[u8], usize), ParquetError> {
    let nulls = |a: &dyn Array| a.null_count() > 0;
    if nulls(list) || nulls(list.values().as_ref()) {
        return Err(ParquetError::General("values hold nulls".into()));
    }
    let hd = list.value_length() as usize;
    let (start, len) = (list.offset() * hd, list.len() * hd);
    let v = list.values().as_any();
    if let Some(a) = v.downcast_ref::<Float16Array>() {
        Ok((
            &a.values().inner().as_slice()[start * 2..(start + len) * 2],
            2,
        ))
    } else if let Some(a) = v.downcast_ref::<Float32Array>() {
        Ok((
            &a.values().inner().as_slice()[start * 4..(start + len) * 4],
            4,
        ))
    } else {
        Err(ParquetError::General(
            "values are not float16 or float32".into(),
        ))
    }
}

/// Append an RLE run (the RLE/bit-packed hybrid: ULEB128 of `count << 1`, then the value in
/// whole bytes) of `count` levels `value`.
fn rle_run(out: &mut Vec<u8>, value: i16, count: usize) {
    let mut h = (count as u64) << 1;
    loop {
        let b = (h & 0x7f) as u8;
        h >>= 7;
        if h == 0 {
            out.push(b);
            break;
        }
        out.push(b | 0x80);
    }
    out.push(value as u8); // levels are at most 3 here: one byte
}

/// The levels of `rows` rows of `hd` values (V1 page: a 4-byte length, then the runs); nothing
/// when the column has no level of this kind.
fn levels(out: &mut Vec<u8>, max: i16, runs: impl FnOnce(&mut Vec<u8>)) {
    if max == 0 {
        return;
    }
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    runs(out);
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// The values column chunk of one row group: data pages (V1) of whole rows, as a byte buffer
/// positioned at 0, with the metadata the row group writer needs to splice it.
fn encode_values(
    descr: &ColumnDescPtr,
    list: &FixedSizeListArray,
    s: Settings,
) -> std::result::Result<(Bytes, ColumnCloseResult), ParquetError> {
    let (raw, width) = value_bytes(list)?;
    let hd = list.value_length() as usize;
    let rows = list.len();
    let (max_rep, max_def) = (descr.max_rep_level(), descr.max_def_level());
    if max_rep > 1 || max_def > 3 {
        return Err(ParquetError::General("unexpected values schema".into()));
    }
    let row_bytes = (hd * width).max(1);
    let per_page = (s.page_bytes / row_bytes).max(1);
    let encoding = if s.split {
        Encoding::BYTE_STREAM_SPLIT
    } else {
        Encoding::PLAIN
    };
    let mut zstd = match s.zstd {
        Some(level) => Some(zstd::bulk::Compressor::new(level)?),
        None => None,
    };
    let mut sink = TrackedWrite::new(Vec::with_capacity(raw.len() + raw.len() / 16 + 1024));
    let (mut compressed, mut uncompressed) = (0i64, 0i64);
    {
        let mut pages = SerializedPageWriter::new(&mut sink);
        let mut row = 0;
        while row < rows {
            let r = per_page.min(rows - row);
            let n = r * hd;
            // a fresh buffer per page: uncompressed, it becomes the page without a copy
            let mut buf = Vec::with_capacity(r * (row_bytes + 8) + 64);
            levels(&mut buf, max_rep, |b| {
                if hd == 1 {
                    rle_run(b, 0, r);
                } else {
                    for _ in 0..r {
                        rle_run(b, 0, 1);
                        if hd > 1 {
                            rle_run(b, 1, hd - 1);
                        }
                    }
                }
            });
            levels(&mut buf, max_def, |b| rle_run(b, max_def, n));
            let src = &raw[row * row_bytes..(row + r) * row_bytes];
            if s.split {
                let at = buf.len();
                buf.resize(at + src.len(), 0);
                let planes = &mut buf[at..];
                for k in 0..width {
                    let plane = &mut planes[k * n..(k + 1) * n];
                    for (i, p) in plane.iter_mut().enumerate() {
                        *p = src[i * width + k];
                    }
                }
            } else {
                buf.extend_from_slice(src);
            }
            let len = buf.len();
            let data = match zstd.as_mut() {
                Some(c) => Bytes::from(c.compress(&buf)?),
                None => Bytes::from(buf),
            };
            let page = Page::DataPage {
                buf: data,
                num_values: n as u32,
                encoding,
                def_level_encoding: Encoding::RLE,
                rep_level_encoding: Encoding::RLE,
                statistics: None,
            };
            let spec = pages.write_page(CompressedPage::new(page, len))?;
            compressed += spec.compressed_size as i64;
            uncompressed += spec.uncompressed_size as i64;
            row += r;
        }
        pages.close()?;
    }
    let chunk = Bytes::from(sink.into_inner()?);
    let metadata = ColumnChunkMetaData::builder(descr.clone())
        .set_compression_codec(
            match s.zstd {
                Some(l) => Compression::ZSTD(ZstdLevel::try_new(l)?),
                None => Compression::UNCOMPRESSED,
            }
            .into(),
        )
        .set_encodings(vec![encoding, Encoding::RLE])
        .set_total_compressed_size(compressed)
        .set_total_uncompressed_size(uncompressed)
        .set_num_values((rows * hd) as i64)
        .set_data_page_offset(0)
        .build()?;
    Ok((
        chunk,
        ColumnCloseResult {
            bytes_written: compressed as u64,
            rows_written: rows as u64,
            metadata,
            bloom_filter: None,
            column_index: None,
            offset_index: None,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rle_runs_are_uleb128_headers_then_the_value() {
        let mut b = Vec::new();
        rle_run(&mut b, 1, 127);
        assert_eq!(b, vec![0xfe, 0x01, 1]);
        b.clear();
        rle_run(&mut b, 3, 1);
        assert_eq!(b, vec![2, 3]);
    }

    #[test]
    fn levels_are_length_prefixed_and_absent_at_level_0() {
        let mut b = Vec::new();
        levels(&mut b, 0, |b| rle_run(b, 0, 5));
        assert!(b.is_empty());
        levels(&mut b, 3, |b| rle_run(b, 3, 5));
        assert_eq!(b, vec![2, 0, 0, 0, 10, 3]);
    }
}
