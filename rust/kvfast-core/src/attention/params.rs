//! How llama.cpp computes each layer's attention weights, from the model's GGUF header: query
//! heads and the KV head each reads (grouped-query attention), the softmax scale, logit
//! soft-capping, the sliding window and its kind.
//!
//! The rules follow llama.cpp's graph code (llama-cpp-python 0.3.36's: src/llama-graph.cpp
//! `build_attn_mha`, src/models/<arch>.cpp, src/llama-hparams.h `is_masked_swa`):
//!
//! - logits: `scale * q . k` over the cells a query may see, `q` the query after RoPE (before any
//!   query scaling a model does in its graph: Gemma 2 / 3 multiply q by their scale, then pass
//!   1.0), `k` the key as kvfast gives it (RoPE applied, the Hadamard rotation of a quantized
//!   cache undone); query head `h` reads KV head `h / (n_head / n_head_kv)` (ggml's broadcast);
//! - the scale: `1 / sqrt(head size)` by default (`kq_scale` of most models); `attention.scale`
//!   where the arch's loader reads it (the Granite family, DFlash); Gemma 2 and 3:
//!   `1 / sqrt(embedding_length / head_count)` for their 27B models, else `1 / sqrt(key_length)`;
//!   the MLA models: `mscale^2 / sqrt(key_length_mla)`;
//! - soft-capping (Gemma 2: `attn_logit_softcapping`, 50 by default):
//!   `cap * tanh(scale * q . k / cap)`;
//! - the window of sliding layers (`attention.sliding_window`): standard (a cell at `p0` is out of
//!   the window of a query at `p1` when `p1 - p0 >= n_swa`), chunked (Llama 4: `p0 < p1 / n * n`)
//!   or symmetric (`|p1 - p0| > n / 2`).
//!
//! What kvfast does not compute is refused with the key that asks for it (ALiBi, Grok's scaled
//! soft-cap), never approximated.

use crate::model::geometry::{Metadata, Model, ModelError, ModelRope};
use crate::model::gguf::Value;

/// How a sliding-window layer masks the cells out of its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// Every cell of the query's sequence at or before its position.
    None,
    /// llama.cpp's LLAMA_SWA_TYPE_STANDARD: the last `n` positions.
    Standard(u32),
    /// LLAMA_SWA_TYPE_CHUNKED: the query's chunk of `n` positions.
    Chunked(u32),
    /// LLAMA_SWA_TYPE_SYMMETRIC: `n / 2` positions either side.
    Symmetric(u32),
}

impl Window {
    /// Whether a cell at `p0` is out of the window of a query at `p1` (llama.cpp's
    /// `is_masked_swa`).
    pub fn masks(self, p0: i32, p1: i32) -> bool {
        match self {
            Window::None => false,
            Window::Standard(n) => i64::from(p1) - i64::from(p0) >= i64::from(n),
            Window::Chunked(n) => {
                let n = i64::from(n.max(1));
                i64::from(p0) < i64::from(p1).div_euclid(n) * n
            }
            Window::Symmetric(n) => {
                let half = i64::from(n / 2);
                let d = i64::from(p1) - i64::from(p0);
                d < -half || d > half
            }
        }
    }

    /// "none", "standard", "chunked" or "symmetric".
    pub fn kind(self) -> &'static str {
        match self {
            Window::None => "none",
            Window::Standard(_) => "standard",
            Window::Chunked(_) => "chunked",
            Window::Symmetric(_) => "symmetric",
        }
    }

    /// The window's size (0: none).
    pub fn size(self) -> u32 {
        match self {
            Window::None => 0,
            Window::Standard(n) | Window::Chunked(n) | Window::Symmetric(n) => n,
        }
    }
}

/// One attention layer of the model, as its softmax is computed.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerAttn {
    pub model_layer: u32,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Values per query and key head.
    pub head_dim: usize,
    pub scale: f64,
    /// Logit soft-capping (None: none).
    pub softcap: Option<f64>,
    pub window: Window,
    /// Learned per-head sink logits (None: none; the model's header does not hold them: a probe
    /// capture reads them from llama.cpp's graph).
    pub sinks: Option<Vec<f64>>,
}

impl LayerAttn {
    /// The KV head query head `h` reads.
    pub fn kv_head(&self, h: usize) -> usize {
        let group = (self.n_head / self.n_head_kv.max(1)).max(1);
        h / group
    }
}

/// Archs whose loader reads `attention.scale` (`LLM_KV_ATTENTION_SCALE`, src/models/*.cpp).
pub const READS_ATTENTION_SCALE: [&str; 6] = [
    "granite",
    "granitemoe",
    "granitehybrid",
    "granite_swa",
    "graniteswitch",
    "dflash",
];

/// Archs that scale the query by `f_attention_scale` in their graph (Gemma 2 / 3: 1 / sqrt of the
/// head size, or of embedding / heads for the 27B models of `n_layer` layers).
pub const GEMMA_SCALE: [(&str, usize); 2] = [("gemma2", 46), ("gemma3", 62)];

/// Archs of sparse attention (a lightning indexer's top-k cells unmasked: llama-graph.cpp's
/// `build_attn` with `kq_mask_top_k`), whose weights kvfast does not compute.
pub const SPARSE: [&str; 5] = ["deepseek32", "dots3note", "glm-dsa", "glm5-next", "hy_v4"];

/// Archs of MLA attention (`hparams.is_mla()` in their graph): the scale is over `key_length_mla`.
pub const MLA: [&str; 7] = [
    "deepseek2",
    "deepseek32",
    "dots3note",
    "hy_v4",
    "glm-dsa",
    "kimi-linear",
    "kimi-k3",
];

fn bad(field: String, message: String) -> ModelError {
    ModelError::Metadata { field, message }
}

fn number(meta: &Metadata, key: &str) -> Result<Option<f64>, ModelError> {
    match meta.get(key) {
        None => Ok(None),
        Some(Value::Int(i)) => Ok(Some(*i as f64)),
        Some(Value::Float(f)) if f.is_finite() => Ok(Some(*f)),
        Some(v) => Err(bad(
            key.to_string(),
            format!("{key} is {v:?}: expected a finite number"),
        )),
    }
}

/// A per-layer count (a list of n_layer, or one for all).
fn per_layer(meta: &Metadata, key: &str, il: usize) -> Result<Option<i64>, ModelError> {
    let v = match meta.get(key) {
        None => return Ok(None),
        Some(Value::Array(items)) => items.get(il),
        Some(v) => Some(v),
    };
    match v {
        Some(Value::Int(i)) if *i >= 0 => Ok(Some(*i)),
        other => Err(bad(
            key.to_string(),
            format!("{key}[{il}] is {other:?}: expected a count"),
        )),
    }
}

impl LayerAttn {
    /// The attention layers of `model` (a KV head and a place in the attention caches), in
    /// order.
    pub fn of_model(model: &Model) -> Result<Vec<LayerAttn>, ModelError> {
        let g = &model.geometry;
        let meta = &model.metadata;
        let a = g.arch.as_str();
        let key = |k: &str| format!("{a}.{k}");
        if let Some(b) = number(meta, &key("attention.max_alibi_bias"))? {
            if b > 0.0 {
                return Err(bad(
                    key("attention.max_alibi_bias"),
                    format!("{a} uses ALiBi (max_alibi_bias {b}): kvfast does not compute its attention"),
                ));
            }
        }
        if SPARSE.contains(&a) {
            return Err(bad(
                "general.architecture".into(),
                format!(
                    "{a} attends to the cells its lightning indexer picks (DeepSeek sparse attention): \
                     kvfast does not compute its attention"
                ),
            ));
        }
        // a memory's parts kvfast-core's geometry knows (model/memory.rs): MSA's block-sparse
        // attention through its indexer, Gemma 4's sliding-window heads of another size
        if g.indexer.is_some() {
            return Err(bad(
                "general.architecture".into(),
                format!(
                    "{a} attends to the blocks its indexer picks (sparse attention): kvfast does not \
                     compute its attention"
                ),
            ));
        }
        if let Some([k, _]) = g.head_dims_swa {
            return Err(bad(
                key("attention.key_length_swa"),
                format!(
                    "{a}'s sliding-window layers have K heads of {k}, its full-attention layers of \
                     {}: kvfast computes attention in one head size",
                    g.head_dim_k
                ),
            ));
        }
        if a == "grok" {
            return Err(bad(
                "general.architecture".into(),
                "grok scales its logits by attn_output_multiplier before its soft-cap: kvfast does \
                 not compute its attention"
                    .into(),
            ));
        }
        let head_dim = g.head_dim_k as usize;
        let mut scale = 1.0 / (head_dim as f64).sqrt();
        if READS_ATTENTION_SCALE.contains(&a) {
            if let Some(s) = number(meta, &key("attention.scale"))? {
                if s != 0.0 {
                    scale = s;
                }
            }
        }
        if let Some((_, n_27b)) = GEMMA_SCALE.iter().find(|(x, _)| *x == a) {
            if g.n_layer == *n_27b {
                let emb = number(meta, &key("embedding_length"))?.unwrap_or(0.0);
                let heads = per_layer(meta, &key("attention.head_count"), 0)?.unwrap_or(0) as f64;
                if emb > 0.0 && heads > 0.0 {
                    scale = 1.0 / (emb / heads).trunc().sqrt();
                }
            }
        }
        if MLA.contains(&a) {
            let k_mla = number(meta, &key("attention.key_length_mla"))?.unwrap_or(head_dim as f64);
            let rope = ModelRope::from_metadata(&model.source, meta, head_dim).ok();
            let mscale = match rope {
                Some(r) if r.global.ext_factor != 0.0 && r.global.freq_scale != 1.0 => {
                    let fs = f64::from(r.global.freq_scale);
                    let log_mul =
                        number(meta, &key("rope.scaling.yarn_log_multiplier"))?.unwrap_or(0.0);
                    let org = f64::from(r.global.attn_factor) * (1.0 + 0.1 * (1.0 / fs).ln());
                    org * (1.0 + 0.1 * log_mul * (1.0 / fs).ln())
                }
                _ => 1.0,
            };
            scale = mscale * mscale / k_mla.sqrt();
        }
        let softcap = if a == "gemma2" {
            Some(number(meta, &key("attn_logit_softcapping"))?.unwrap_or(50.0))
        } else {
            None
        };
        let window_key = key("attention.sliding_window");
        let n_swa = number(meta, &window_key)?.unwrap_or(0.0);
        let kind = match a {
            "llama4" => Window::Chunked as fn(u32) -> Window,
            "gemma-embedding" | "modern-bert" => Window::Symmetric,
            _ => Window::Standard,
        };
        let attention = g.attention.clone().unwrap_or_else(|| vec![true; g.n_layer]);
        let mut out = vec![];
        for il in 0..g.n_layer {
            let n_head_kv = g.n_head_kv.get(il).copied().unwrap_or(0) as usize;
            if !attention.get(il).copied().unwrap_or(false) || n_head_kv == 0 {
                continue;
            }
            let name = key("attention.head_count");
            let n_head = per_layer(meta, &name, il)?.unwrap_or(0) as usize;
            if n_head == 0 || n_head % n_head_kv != 0 {
                return Err(bad(
                    name.clone(),
                    format!(
                        "{name} is {n_head} in layer {il}: expected a multiple of its {n_head_kv} \
                         KV heads"
                    ),
                ));
            }
            let window = if g.swa.get(il).copied().unwrap_or(false) {
                if !(n_swa >= 1.0 && n_swa <= f64::from(u32::MAX)) {
                    return Err(bad(
                        window_key.clone(),
                        format!(
                            "layer {il} slides but {window_key} is {n_swa}: expected the window's \
                             size"
                        ),
                    ));
                }
                kind(n_swa as u32)
            } else {
                Window::None
            };
            out.push(LayerAttn {
                model_layer: il as u32,
                n_head,
                n_head_kv,
                head_dim,
                scale,
                softcap,
                window,
                sinks: None,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn model(arch: &str, kvs: &[(&str, Value)]) -> Model {
        let mut v = vec![("general.architecture".to_string(), Value::Str(arch.into()))];
        v.extend(kvs.iter().map(|(k, x)| (format!("{arch}.{k}"), x.clone())));
        Model::from_metadata("m.gguf", v).unwrap()
    }

    #[test]
    fn windows_mask_as_llama_cpp_does() {
        assert!(!Window::Standard(4).masks(5, 8) && Window::Standard(4).masks(4, 8));
        assert!(Window::Chunked(4).masks(7, 8) && !Window::Chunked(4).masks(8, 11));
        assert!(Window::Symmetric(4).masks(5, 8) && !Window::Symmetric(4).masks(6, 8));
        assert!(!Window::None.masks(0, i32::MAX));
    }

    #[test]
    fn gemma3_scales_by_its_head_and_slides_five_of_six() {
        let m = model(
            "gemma3",
            &[
                ("block_count", Value::Int(6)),
                ("embedding_length", Value::Int(640)),
                ("attention.head_count", Value::Int(4)),
                ("attention.head_count_kv", Value::Int(1)),
                ("attention.key_length", Value::Int(256)),
                ("attention.sliding_window", Value::Int(512)),
            ],
        );
        let l = LayerAttn::of_model(&m).unwrap();
        assert_eq!(l.len(), 6);
        assert_eq!(l[0].scale, 1.0 / 16.0);
        assert_eq!(l[0].window, Window::Standard(512));
        assert_eq!(l[5].window, Window::None);
        assert_eq!((l[0].kv_head(3), l[0].n_head), (0, 4));
    }

    #[test]
    fn granite_reads_its_scale_and_others_ignore_it() {
        let kvs = [
            ("block_count", Value::Int(1)),
            ("attention.head_count", Value::Int(4)),
            ("attention.head_count_kv", Value::Int(2)),
            ("attention.key_length", Value::Int(64)),
            ("attention.scale", Value::Float(0.25)),
        ];
        let g = LayerAttn::of_model(&model("granite", &kvs)).unwrap();
        assert_eq!(g[0].scale, 0.25);
        assert_eq!(g[0].kv_head(3), 1);
        let q = LayerAttn::of_model(&model("qwen3", &kvs)).unwrap();
        assert_eq!(q[0].scale, 1.0 / 8.0);
        let mut gemma2 = kvs.to_vec();
        gemma2.push(("attn_logit_softcapping", Value::Float(30.0)));
        gemma2.push(("attention.sliding_window", Value::Int(4096))); // its layer 0 slides
        assert_eq!(
            LayerAttn::of_model(&model("gemma2", &gemma2)).unwrap()[0].softcap,
            Some(30.0)
        );
    }

    #[test]
    fn what_kvfast_does_not_compute_is_refused_by_its_key() {
        let mut kvs = vec![
            ("block_count", Value::Int(1)),
            ("attention.head_count", Value::Int(3)),
            ("attention.head_count_kv", Value::Int(2)),
            ("attention.key_length", Value::Int(64)),
        ];
        let e = LayerAttn::of_model(&model("qwen3", &kvs)).unwrap_err();
        assert_eq!(e.field(), Some("qwen3.attention.head_count"));
        kvs[1].1 = Value::Int(4);
        kvs.push(("attention.max_alibi_bias", Value::Float(8.0)));
        let e = LayerAttn::of_model(&model("bloom", &kvs)).unwrap_err();
        assert_eq!(e.field(), Some("bloom.attention.max_alibi_bias"));
        kvs.pop();
        let e = LayerAttn::of_model(&model("glm-dsa", &kvs)).unwrap_err();
        assert!(e.to_string().contains("lightning indexer"), "{e}");
        let e = LayerAttn::of_model(&model(
            "gemma3",
            &[
                ("block_count", Value::Int(6)),
                ("attention.head_count", Value::Int(4)),
                ("attention.head_count_kv", Value::Int(1)),
                ("attention.key_length", Value::Int(256)),
            ],
        ))
        .unwrap_err();
        assert_eq!(e.field(), Some("gemma3.attention.sliding_window"));
    }

    #[test]
    fn real_models() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/models");
        let q = LayerAttn::of_model(&Model::read(dir.join("tiny-qwen3.gguf")).unwrap()).unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!((q[0].n_head, q[0].n_head_kv, q[0].head_dim), (4, 2, 32));
        let d = LayerAttn::of_model(&Model::read(dir.join("tiny-deepseek2-mla.gguf")).unwrap())
            .unwrap();
        assert_eq!((d[0].n_head, d[0].n_head_kv, d[0].head_dim), (4, 1, 192));
        assert_eq!(d[0].scale, 1.0 / 96f64.sqrt()); // key_length_mla = 32 + 64
        let h = LayerAttn::of_model(&Model::read(dir.join("tiny-qwen35.gguf")).unwrap()).unwrap();
        assert_eq!(h.iter().map(|l| l.model_layer).collect::<Vec<_>>(), [3]);
        let m = LayerAttn::of_model(&Model::read(dir.join("tiny-mamba2.gguf")).unwrap()).unwrap();
        assert!(m.is_empty());
        let s = LayerAttn::of_model(&Model::read(dir.join("tiny-lfm2-swa.gguf")).unwrap()).unwrap();
        assert!(s.iter().all(|l| l.window == Window::Standard(4)));
    }
}
