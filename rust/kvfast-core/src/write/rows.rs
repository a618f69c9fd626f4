//! A record's rows as the writer holds them: read from the source's bytes when they are written,
//! never copied, with the edits made on them recorded (the cells kept, the requantizations) and
//! applied a row at a time as the rows are written; or owned bytes (new values).
//!
//! Writing a state so needs memory for its cells and a few rows, not for its rows: a row per record
//! is decoded and requantized at a time, and only a transposed V written from requantized rows is
//! gathered whole (one record). The buffers a record needs are allocated fallibly: an allocation
//! that fails is [`Error::NoMemory`], never an abort.

use std::borrow::Cow;
use std::io::Write;
use std::sync::Arc;

use crate::error::{try_buffer, Error, Result};
use crate::format::layout::Kind;
use crate::format::types::GgmlType;
use crate::values::decode::decode_row;
use crate::values::quantize::quantize_row;
use crate::values::rotation::hadamard_groups;
use crate::write::{err, WriteError};

/// The bytes of the state the parts were taken from, shared: every row not given new values, and
/// the outputs block, are read from them when the state is written.
pub type SourceBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

fn bytes_of(src: &SourceBytes) -> &[u8] {
    (**src).as_ref()
}

/// Where rows come from before their edits.
#[derive(Clone)]
enum Base {
    /// A record of the source: `cells` rows at `offset`, element-major when `transposed`.
    Source {
        bytes: SourceBytes,
        offset: usize,
        cells: usize,
        transposed: bool,
    },
    /// Rows given (new values), cell-major.
    Owned(Arc<Vec<u8>>),
}

/// A requantization: the rows decoded with the rotation in groups of `from_group` undone, stored as
/// `to` rotated in groups of `to_group` (0: not rotated), as llama.cpp stores that type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Conv {
    to: GgmlType,
    from_group: usize,
    to_group: usize,
}

/// Rows of one base: the cells of it kept, in order (None: every one), and the requantizations
/// they go through, in order.
#[derive(Clone)]
struct Segment {
    base: Base,
    /// The type of the base's rows.
    ty: GgmlType,
    pick: Option<Vec<u32>>,
    convs: Vec<Conv>,
}

impl Segment {
    fn base_cells(&self, rb: usize) -> usize {
        match &self.base {
            Base::Source { cells, .. } => *cells,
            Base::Owned(v) => v.len().checked_div(rb).unwrap_or(0),
        }
    }

    fn cells(&self, rb: usize) -> usize {
        self.pick
            .as_ref()
            .map_or_else(|| self.base_cells(rb), |p| p.len())
    }

    /// The base cell of the segment's cell `i`.
    fn base_index(&self, i: usize) -> usize {
        self.pick.as_ref().map_or(i, |p| p[i] as usize)
    }

    /// The base's bytes and whether they are element-major.
    fn data(&self) -> (&[u8], bool) {
        match &self.base {
            Base::Source {
                bytes,
                offset,
                transposed,
                ..
            } => (&bytes_of(bytes)[*offset..], *transposed),
            Base::Owned(v) => (v, false),
        }
    }
}

/// Scratch space of a row's conversions, allocated once per record written.
struct Scratch {
    gathered: Vec<u8>,
    values: Vec<f32>,
    a: Vec<u8>,
    b: Vec<u8>,
}

impl Scratch {
    fn new(n: usize) -> Result<Scratch> {
        Ok(Scratch {
            gathered: Vec::new(),
            values: try_buffer(n, || format!("a row of {n} values"))?,
            a: Vec::new(),
            b: Vec::new(),
        })
    }
}

/// One record: its kind, type, values per cell and the rows of every cell (see the module's doc).
#[derive(Clone)]
pub struct Rows {
    pub kind: Kind,
    /// The type the rows are written in (changed by [`Rows::store`] and [`Rows::retype`] only).
    pub ty: GgmlType,
    pub n_embd: u64,
    /// Offset of the record's header in the source (for errors).
    pub at: u64,
    segments: Vec<Segment>,
}

impl std::fmt::Debug for Rows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rows")
            .field("kind", &self.kind)
            .field("ty", &self.ty)
            .field("n_embd", &self.n_embd)
            .field("cells", &self.cells())
            .field("at", &self.at)
            .finish()
    }
}

/// Rows are equal when they are of one kind, type and width and every row is the same.
impl PartialEq for Rows {
    fn eq(&self, other: &Rows) -> bool {
        self.kind == other.kind
            && self.ty == other.ty
            && self.n_embd == other.n_embd
            && self.cells() == other.cells()
            && (0..self.cells()).all(|i| self.row(i) == other.row(i))
    }
}

/// One conversion of a row: `from` (of type `ty`) decoded, its rotation undone and done again, stored
/// in `out` as the conversion's type.
fn step(ty: GgmlType, c: &Conv, from: &[u8], out: &mut Vec<u8>, n: u64, values: &mut [f32]) {
    decode_row(ty, from, values);
    hadamard_groups(values, c.from_group);
    hadamard_groups(values, c.to_group);
    out.clear();
    out.resize(c.to.row_bytes(n).unwrap_or(0) as usize, 0);
    quantize_row(c.to, values, out);
}

/// A row of `ty` through `convs`, each in turn (the result in one of the scratch buffers, or `src`
/// itself when there is none).
fn convert<'a>(
    ty: GgmlType,
    convs: &[Conv],
    src: &'a [u8],
    n: u64,
    values: &mut [f32],
    a: &'a mut Vec<u8>,
    b: &'a mut Vec<u8>,
) -> &'a [u8] {
    let Some((first, rest)) = convs.split_first() else {
        return src;
    };
    step(ty, first, src, a, n, values);
    let (mut ty, mut in_a) = (first.to, true);
    for c in rest {
        if in_a {
            step(ty, c, &a[..], b, n, values);
        } else {
            step(ty, c, &b[..], a, n, values);
        }
        ty = c.to;
        in_a = !in_a;
    }
    if in_a {
        a
    } else {
        b
    }
}

impl Rows {
    /// Rows given as bytes, cell-major.
    pub fn from_bytes(kind: Kind, ty: GgmlType, n_embd: u64, rows: Vec<u8>, at: u64) -> Rows {
        Rows {
            kind,
            ty,
            n_embd,
            at,
            segments: vec![Segment {
                base: Base::Owned(Arc::new(rows)),
                ty,
                pick: None,
                convs: vec![],
            }],
        }
    }

    /// The rows of a record of the source (`cells` of them at `offset`, element-major when
    /// `transposed`), read when written; the record's bytes are checked to be there.
    #[allow(clippy::too_many_arguments)]
    pub fn from_source(
        kind: Kind,
        ty: GgmlType,
        n_embd: u64,
        bytes: SourceBytes,
        offset: u64,
        cells: usize,
        transposed: bool,
        at: u64,
    ) -> Result<Rows> {
        let rb = ty.row_bytes(n_embd).unwrap_or(0);
        let need = rb.checked_mul(cells as u64);
        let have = (bytes_of(&bytes).len() as u64).saturating_sub(offset);
        match need {
            Some(need) if need <= have => {}
            _ => {
                return Err(Error::Truncated {
                    field: format!("{kind} record rows"),
                    offset,
                    needed: need.unwrap_or(u64::MAX),
                    available: have,
                })
            }
        }
        Ok(Rows {
            kind,
            ty,
            n_embd,
            at,
            segments: vec![Segment {
                base: Base::Source {
                    bytes,
                    offset: offset as usize,
                    cells,
                    transposed,
                },
                ty,
                pick: None,
                convs: vec![],
            }],
        })
    }

    /// Bytes of one cell's row.
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.n_embd).unwrap_or(0) as usize
    }

    /// The cells (rows) held.
    pub fn cells(&self) -> usize {
        self.segments
            .iter()
            .map(|s| s.cells(s.ty.row_bytes(self.n_embd).unwrap_or(0) as usize))
            .sum()
    }

    /// Bytes of every row, as written.
    pub fn byte_len(&self) -> usize {
        self.cells() * self.row_bytes()
    }

    fn base_rb(&self, s: &Segment) -> usize {
        s.ty.row_bytes(self.n_embd).unwrap_or(0) as usize
    }

    /// The base row `b` of `s`, gathered into `gathered` when the base is element-major.
    fn base_row<'a>(&self, s: &'a Segment, b: usize, gathered: &'a mut Vec<u8>) -> &'a [u8] {
        let rb = self.base_rb(s);
        let (data, transposed) = s.data();
        if !transposed {
            return &data[b * rb..(b + 1) * rb];
        }
        let el = s.ty.block_bytes();
        let total = s.base_cells(rb);
        gathered.clear();
        for j in 0..self.n_embd as usize {
            let at = (j * total + b) * el;
            gathered.extend_from_slice(&data[at..at + el]);
        }
        gathered
    }

    /// The row of cell `i`, as written.
    pub fn row(&self, mut i: usize) -> Cow<'_, [u8]> {
        for s in &self.segments {
            let n = s.cells(self.base_rb(s));
            if i >= n {
                i -= n;
                continue;
            }
            let b = s.base_index(i);
            if s.convs.is_empty() && !s.data().1 {
                let rb = self.base_rb(s);
                return Cow::Borrowed(&s.data().0[b * rb..(b + 1) * rb]);
            }
            let mut gathered = Vec::new();
            let src = self.base_row(s, b, &mut gathered);
            let mut values = vec![0f32; self.n_embd as usize];
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let out = convert(
                s.ty,
                &s.convs,
                src,
                self.n_embd,
                &mut values,
                &mut a,
                &mut b,
            );
            return Cow::Owned(out.to_vec());
        }
        panic!("row {i} past the rows held")
    }

    /// Keep the rows of the cells `keep` says (a cell past its end is kept).
    pub fn keep(&mut self, keep: &[bool]) {
        let mut start = 0;
        let n_embd = self.n_embd;
        for s in &mut self.segments {
            let rb = s.ty.row_bytes(n_embd).unwrap_or(0) as usize;
            let n = s.cells(rb);
            let mask = keep.get(start..).unwrap_or(&[]);
            start += n;
            if mask.iter().take(n).all(|k| *k) {
                continue;
            }
            let pick: Vec<u32> = (0..n)
                .filter(|&i| *mask.get(i).unwrap_or(&true))
                .map(|i| s.base_index(i) as u32)
                .collect();
            s.pick = Some(pick);
        }
        self.segments
            .retain(|s| s.cells(s.ty.row_bytes(n_embd).unwrap_or(0) as usize) > 0);
    }

    /// Put the rows of `other` (of the same type and width) after these.
    pub fn append(&mut self, other: Rows) {
        self.segments.extend(other.segments);
    }

    /// The rows as f32 values in the model's basis (`group`: the rotation they are stored in, 0
    /// for none).
    pub fn values(&self, group: usize) -> Vec<f32> {
        let n = self.n_embd as usize;
        let cells = self.cells();
        let mut out = vec![0f32; n * cells];
        for i in 0..cells {
            let row = &mut out[i * n..(i + 1) * n];
            decode_row(self.ty, &self.row(i), row);
            hadamard_groups(row, group);
        }
        out
    }

    /// Check that rows of `n_embd` values can be stored as `ty` rotated in groups of `group`.
    fn check_type(&self, ty: GgmlType, group: usize) -> std::result::Result<usize, WriteError> {
        let n = self.n_embd as usize;
        let rb = ty.row_bytes(self.n_embd).ok_or_else(|| {
            err(
                format!("{} record type", self.kind),
                format!("cache_type_{}", self.kind),
                format!("a type whose blocks divide the {n} values of a row"),
                ty,
            )
        })? as usize;
        if group > 0 && n % group != 0 {
            return Err(err(
                format!("{} record rotation group", self.kind),
                format!("cache_type_{}", self.kind),
                format!("a group dividing the {n} values of a row"),
                group,
            ));
        }
        Ok(rb)
    }

    /// Store `values` (f32 in the model's basis, a row per cell) as type `ty`, rotated in groups of
    /// `group` (0: not rotated) as llama.cpp stores that type.
    pub fn store(
        &mut self,
        ty: GgmlType,
        values: &[f32],
        group: usize,
    ) -> std::result::Result<(), WriteError> {
        let n = self.n_embd as usize;
        let rb = self.check_type(ty, group)?;
        if n > 0 && values.len() % n != 0 {
            return Err(err(
                format!("{} record values", self.kind),
                "values",
                format!("whole rows of {n} values"),
                values.len(),
            ));
        }
        let cells = values.len().checked_div(n).unwrap_or(0);
        let mut out: Vec<u8> = try_buffer(rb * cells, || {
            format!("{cells} rows of the new {} values", self.kind)
        })?;
        let mut row = vec![0f32; n];
        for i in 0..cells {
            row.copy_from_slice(&values[i * n..(i + 1) * n]);
            hadamard_groups(&mut row, group);
            quantize_row(ty, &row, &mut out[i * rb..(i + 1) * rb]);
        }
        *self = Rows::from_bytes(self.kind, ty, self.n_embd, out, self.at);
        Ok(())
    }

    /// Requantize: every row read in the model's basis (its rotation in groups of `from_group`
    /// undone) and stored as `ty` rotated in groups of `to_group`, a row at a time as the rows
    /// are written.
    pub fn retype(
        &mut self,
        ty: GgmlType,
        from_group: usize,
        to_group: usize,
    ) -> std::result::Result<(), WriteError> {
        self.check_type(ty, to_group)?;
        for s in &mut self.segments {
            s.convs.push(Conv {
                to: ty,
                from_group,
                to_group,
            });
        }
        self.ty = ty;
        Ok(())
    }

    /// Write the rows, `transposed` element-major (a V without flash attention) or a row per cell.
    pub fn write_rows(&self, w: &mut impl Write, transposed: bool) -> Result<()> {
        if transposed {
            return self.write_transposed(w);
        }
        let n = self.n_embd as usize;
        let mut scratch: Option<Scratch> = None;
        for s in &self.segments {
            let rb = self.base_rb(s);
            let (data, element_major) = s.data();
            if s.convs.is_empty() && !element_major {
                match &s.pick {
                    None => w.write_all(&data[..s.base_cells(rb) * rb])?,
                    Some(p) => {
                        // runs of consecutive cells in one write
                        let mut i = 0;
                        while i < p.len() {
                            let mut j = i + 1;
                            while j < p.len() && p[j] == p[j - 1] + 1 {
                                j += 1;
                            }
                            let (a, b) = (p[i] as usize * rb, (p[j - 1] as usize + 1) * rb);
                            w.write_all(&data[a..b])?;
                            i = j;
                        }
                    }
                }
                continue;
            }
            if scratch.is_none() {
                scratch = Some(Scratch::new(n)?);
            }
            let sc = scratch.as_mut().expect("made above");
            for i in 0..s.cells(rb) {
                let Scratch {
                    gathered,
                    values,
                    a,
                    b,
                } = &mut *sc;
                let src = self.base_row(s, s.base_index(i), gathered);
                let out = convert(s.ty, &s.convs, src, self.n_embd, values, a, b);
                w.write_all(out)?;
            }
        }
        Ok(())
    }

    /// Element-major: element 0 of every cell, then element 1, ... (only float types, one value
    /// per block). A segment whose rows are requantized is gathered whole first (one record).
    fn write_transposed(&self, w: &mut impl Write) -> Result<()> {
        let n = self.n_embd as usize;
        let el = self.ty.block_bytes();
        let what = || format!("the transposed {} record at byte {}", self.kind, self.at);
        // per segment: its bytes, whether element-major, its cell count, its base cell count, and
        // its rows requantized (cell-major), when they are
        let mut converted: Vec<Option<Vec<u8>>> = Vec::with_capacity(self.segments.len());
        for s in &self.segments {
            if s.convs.is_empty() {
                converted.push(None);
                continue;
            }
            let rb = self.row_bytes();
            let cells = s.cells(self.base_rb(s));
            let mut buf: Vec<u8> = try_buffer(cells * rb, what)?;
            let mut sc = Scratch::new(n)?;
            for (i, dst) in buf.chunks_exact_mut(rb.max(1)).enumerate().take(cells) {
                let Scratch {
                    gathered,
                    values,
                    a,
                    b,
                } = &mut sc;
                let src = self.base_row(s, s.base_index(i), gathered);
                dst.copy_from_slice(convert(s.ty, &s.convs, src, self.n_embd, values, a, b));
            }
            converted.push(Some(buf));
        }
        let mut line: Vec<u8> = try_buffer(self.cells() * el, what)?;
        for j in 0..n {
            line.clear();
            for (s, conv) in self.segments.iter().zip(&converted) {
                let brb = self.base_rb(s);
                let cells = s.cells(brb);
                if let Some(buf) = conv {
                    let rb = self.row_bytes();
                    for i in 0..cells {
                        line.extend_from_slice(&buf[i * rb + j * el..i * rb + (j + 1) * el]);
                    }
                    continue;
                }
                let (data, element_major) = s.data();
                if element_major {
                    let total = s.base_cells(brb);
                    match &s.pick {
                        None => line.extend_from_slice(&data[j * total * el..(j + 1) * total * el]),
                        Some(p) => {
                            for &b in p {
                                let at = (j * total + b as usize) * el;
                                line.extend_from_slice(&data[at..at + el]);
                            }
                        }
                    }
                } else {
                    for i in 0..cells {
                        let at = s.base_index(i) * brb + j * el;
                        line.extend_from_slice(&data[at..at + el]);
                    }
                }
            }
            w.write_all(&line)?;
        }
        Ok(())
    }
}

/// Bytes of the source written as they are (the outputs block's logits and embeddings): a range of
/// its bytes, read when written.
#[derive(Clone)]
pub struct Span {
    src: Option<SourceBytes>,
    offset: usize,
    len: usize,
}

impl Span {
    /// No bytes.
    pub fn empty() -> Span {
        Span {
            src: None,
            offset: 0,
            len: 0,
        }
    }

    /// Bytes `offset..offset + len` of `src`, checked to be there (`field` names them).
    pub fn of(src: &SourceBytes, offset: u64, len: u64, field: &str) -> Result<Span> {
        let have = (bytes_of(src).len() as u64).saturating_sub(offset);
        if len > have {
            return Err(Error::Truncated {
                field: field.into(),
                offset,
                needed: len,
                available: have,
            });
        }
        Ok(Span {
            src: Some(src.clone()),
            offset: offset as usize,
            len: len as usize,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.src {
            Some(s) => &bytes_of(s)[self.offset..self.offset + self.len],
            None => &[],
        }
    }
}

impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Span({} bytes at {})", self.len, self.offset)
    }
}

impl PartialEq for Span {
    fn eq(&self, other: &Span) -> bool {
        self.bytes() == other.bytes()
    }
}

impl Eq for Span {}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(b: Vec<u8>) -> SourceBytes {
        Arc::new(b)
    }

    #[test]
    fn kept_and_joined_rows_read_and_write_as_copied_ones() {
        // 3 cells of 2 f16 values, cell-major, and the same element-major
        let cm: Vec<u8> = (0..12).collect();
        let mut em = vec![0u8; 12];
        for i in 0..3 {
            for j in 0..2 {
                em[(j * 3 + i) * 2..(j * 3 + i) * 2 + 2]
                    .copy_from_slice(&cm[(i * 2 + j) * 2..(i * 2 + j) * 2 + 2]);
            }
        }
        let a =
            Rows::from_source(Kind::V, GgmlType::F16, 2, src(cm.clone()), 0, 3, false, 0).unwrap();
        let t =
            Rows::from_source(Kind::V, GgmlType::F16, 2, src(em.clone()), 0, 3, true, 0).unwrap();
        assert_eq!(a, t);
        for r in [&a, &t] {
            for tr in [false, true] {
                let mut out = Vec::new();
                r.write_rows(&mut out, tr).unwrap();
                assert_eq!(out, if tr { em.clone() } else { cm.clone() });
            }
        }
        let mut j = t.clone();
        j.keep(&[true, false, true]);
        j.append(a.clone());
        j.keep(&[true, true, false, true, true]);
        assert_eq!(j.cells(), 4);
        let want: Vec<u8> = [0usize, 2, 1, 2]
            .iter()
            .flat_map(|&i| cm[i * 4..(i + 1) * 4].to_vec())
            .collect();
        let mut out = Vec::new();
        j.write_rows(&mut out, false).unwrap();
        assert_eq!(out, want);
        let copied = Rows::from_bytes(Kind::V, GgmlType::F16, 2, want, 0);
        assert_eq!(j, copied);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        j.write_rows(&mut x, true).unwrap();
        copied.write_rows(&mut y, true).unwrap();
        assert_eq!(x, y);
        assert!(Rows::from_source(Kind::K, GgmlType::F16, 2, src(cm), 4, 3, false, 0).is_err());
    }

    #[test]
    fn a_retype_is_made_a_row_at_a_time_as_written() {
        let vals: Vec<f32> = (0..64 * 3).map(|i| (i % 13) as f32 - 6.0).collect();
        let mut eager = Rows::from_bytes(Kind::K, GgmlType::F32, 64, vec![], 0);
        eager.store(GgmlType::F16, &vals, 0).unwrap();
        let lazy_src: Vec<u8> = {
            let mut o = Vec::new();
            eager.write_rows(&mut o, false).unwrap();
            o
        };
        let mut lazy =
            Rows::from_source(Kind::K, GgmlType::F16, 64, src(lazy_src), 0, 3, false, 0).unwrap();
        let f16 = eager.values(0);
        eager.store(GgmlType::Q8_0, &f16, 64).unwrap();
        lazy.retype(GgmlType::Q8_0, 0, 64).unwrap();
        assert_eq!(lazy, eager);
        lazy.keep(&[false, true, true]);
        eager.keep(&[false, true, true]);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        lazy.write_rows(&mut x, false).unwrap();
        eager.write_rows(&mut y, false).unwrap();
        assert_eq!((x.len(), x), (2 * 68, y));
        assert!(lazy.retype(GgmlType::Q8_0, 0, 48).is_err());
    }
}
