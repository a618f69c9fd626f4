//! The inputs of a pass are finite numbers: a NaN or an infinity in a query, a scale or a sink
//! logit makes every weight of its head NaN, which entropy, top-k and the mass per cell would then
//! rank or sum as numbers. Checked once per pass, before any key is read, for what the pass
//! computes (its layers and heads only); the error names the row, the model layer and the head.

use crate::attention::params::LayerAttn;
use crate::attention::AttnError;

/// The query rows of a pass: `values` (rows of `row_len`), each row's position and sequence.
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    pub values: &'a [f32],
    pub row_len: usize,
    pub pos: &'a [i32],
    pub seq: &'a [i32],
}

fn refuse(field: &'static str, message: String) -> AttnError {
    AttnError::Queries { field, message }
}

fn what(x: f64) -> &'static str {
    if x.is_nan() {
        "NaN"
    } else {
        "an infinity"
    }
}

/// Refuse a non-finite scale, soft-cap or sink logit of `attn`, or a non-finite value in the
/// query heads `heads` (of `head_dim` values, from value `offset` of a row) in any row of `q`.
pub fn check(
    q: Rows,
    offset: usize,
    head_dim: usize,
    heads: &[usize],
    attn: &LayerAttn,
) -> Result<(), AttnError> {
    let ml = attn.model_layer;
    if !attn.scale.is_finite() {
        return Err(refuse(
            "scale",
            format!(
                "model layer {ml}: the scale of q . k is {}: expected a finite number",
                attn.scale
            ),
        ));
    }
    if let Some(c) = attn.softcap.filter(|c| !c.is_finite()) {
        return Err(refuse(
            "softcap",
            format!("model layer {ml}: the soft-cap is {c}: expected a finite number"),
        ));
    }
    if let Some(sinks) = &attn.sinks {
        for &h in heads {
            if let Some(s) = sinks.get(h).filter(|s| !s.is_finite()) {
                return Err(refuse(
                    "sinks",
                    format!(
                        "model layer {ml}, head {h}: the sink logit is {s}: expected a finite number"
                    ),
                ));
            }
        }
    }
    let d = head_dim;
    let width = heads.iter().max().map_or(0, |h| (h + 1) * d);
    for (r, row) in q.values.chunks_exact(q.row_len.max(1)).enumerate() {
        let b = &row[offset..offset + width];
        if b.iter().all(|v| v.is_finite()) {
            continue;
        }
        for &h in heads {
            if let Some(i) = b[h * d..(h + 1) * d].iter().position(|v| !v.is_finite()) {
                return Err(refuse(
                    "values",
                    format!(
                        "row {r} (position {}, sequence {}), model layer {ml}, head {h}: value {i} \
                         of the query is {}: a query of NaN or infinite values has no weights",
                        q.pos[r],
                        q.seq[r],
                        what(b[h * d + i] as f64)
                    ),
                ));
            }
        }
    }
    Ok(())
}
