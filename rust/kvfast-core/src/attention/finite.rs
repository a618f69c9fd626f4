//! The inputs of a pass are finite numbers: a NaN or an infinity in a query, a scale or a sink
//! logit makes every weight of its head NaN, which entropy, top-k and the mass per cell would then
//! rank or sum as numbers. Checked once per pass, before any key is read, for what the pass
//! computes (its layers and heads only); the error names the row, the model layer and the head.

use crate::attention::params::LayerAttn;
use crate::attention::pass::{Block, Queries};
use crate::attention::AttnError;

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
/// query heads `heads` of `block` in any row of `q`.
pub fn check(
    q: &Queries,
    block: &Block,
    heads: &[usize],
    attn: &LayerAttn,
) -> Result<(), AttnError> {
    let ml = block.model_layer;
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
    let d = block.head_dim;
    for (r, row) in q.values.chunks_exact(q.row_len.max(1)).enumerate() {
        let b = &row[block.offset..block.offset + block.n_head * d];
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
