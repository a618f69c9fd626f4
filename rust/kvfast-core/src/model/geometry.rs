//! Head geometry, layer order, memory and RoPE of a model, from its GGUF header (tensors are never
//! read).
//!
//! Which layers llama.cpp keeps in its attention caches and which in its recurrent part follows
//! llama.cpp's loader (src/models/<arch>.cpp, `llama_model::create_memory`): recurrent models
//! (Mamba, RWKV) keep every layer in the recurrent part; hybrids split them by architecture (a
//! layer of no KV head is recurrent in LFM2, Granite 4, Jamba, Kimi Linear; Qwen3-Next / Qwen3.5
//! mark every `full_attention_interval`-th layer as attention unless `attention.recurrent_layers`
//! lists them; Falcon-H1 keeps every layer in both; Nemotron-H keeps its MLP layers in neither).
//! An MLA model (`attention.key_length_mla` and `value_length_mla`) keeps K records only.
//!
//! The RoPE of its layers is read as llama.cpp's loader and llama_context read it:
//! `rope.dimension_count` (default: the K head size), `rope.freq_base` (default 10000); the
//! sliding-window layers' `rope.freq_base_swa`, else llama.cpp's default for the arch (the global
//! base for the archs that copy it, 10000 otherwise), scale 1; `rope.scaling.type` (none, linear,
//! yarn) and `rope.scaling.factor` (or `rope.scale_linear`); YaRN's `yarn_beta_fast` /
//! `yarn_beta_slow` (32 / 1), `original_context_length`, `yarn_ext_factor` (1),
//! `yarn_attn_factor` (1; with `yarn_log_multiplier` as llama_context computes it); NORM or NEOX
//! per arch, as llama_model_rope_type; M-RoPE sections from `rope.dimension_sections`.
//!
//! Errors name the GGUF key and say what was expected, in the words (and the Python spelling of
//! the value found) kvfast has always used.

use std::collections::HashMap;
use std::path::Path;

use crate::format::cells::{MAX_EMBD, MAX_LAYERS};
use crate::format::recurrent::RecurrentHint;
use crate::model::arch;
use crate::model::gguf::{read_metadata, Value};
use crate::model::layer_map::ModelLayers;
use crate::model::memory::{self, Indexer};
use crate::values::rope::Rope;

/// What splits a state's rows into heads and its caches' layers into the model's layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    pub arch: String,
    /// block_count.
    pub n_layer: usize,
    pub head_dim_k: u64,
    pub head_dim_v: u64,
    /// Per layer.
    pub n_head_kv: Vec<u64>,
    /// Per layer, whether it attends through the sliding window.
    pub swa: Vec<bool>,
    /// Per layer, whether it has R and S records in the recurrent part; None where kvfast cannot
    /// tell (an arch it does not know with recurrent hyperparameters).
    pub recurrent: Option<Vec<bool>>,
    /// Per layer, whether it is in the attention caches; None: every layer.
    pub attention: Option<Vec<bool>>,
    /// Whether the attention caches hold K records only (MLA); None: not known.
    pub v_less: Option<bool>,
    /// The recurrent part's n_layer field (block_count less the NextN / MTP layers).
    pub n_layer_trunk: Option<usize>,
    /// The [K, V] head sizes of the sliding-window layers where they are not the model's (Gemma 4).
    pub head_dims_swa: Option<[u64; 2]>,
    /// The sparse attention's indexer cache, written after the attention caches (DSA, MSA).
    pub indexer: Option<Indexer>,
}

/// The RoPE of a model's layers: full-attention layers, and sliding-window ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRope {
    pub global: Rope,
    pub swa: Rope,
}

/// Metadata that is not what a model's is, or a RoPE kvfast does not undo.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A key of the wrong type or out of range (kvfast's ModelMismatchError): `field` is the key.
    #[error("{message}")]
    Metadata { field: String, message: String },
    /// Keys before RoPE cannot be given for this model (kvfast's PreRopeError): `field` names the
    /// GGUF key.
    #[error("{message}")]
    Rope { field: String, message: String },
    /// Reading the GGUF header.
    #[error(transparent)]
    Read(#[from] crate::Error),
}

impl ModelError {
    /// The GGUF key the error names (None for a read error's own field).
    pub fn field(&self) -> Option<&str> {
        match self {
            ModelError::Metadata { field, .. } | ModelError::Rope { field, .. } => Some(field),
            ModelError::Read(e) => e.field(),
        }
    }
}

pub type Result<T> = std::result::Result<T, ModelError>;

/// A GGUF header's metadata as a map (a later key replaces an earlier one; arrays too long to
/// keep, vocabularies, are left out).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata(HashMap<String, Value>);

impl Metadata {
    pub fn new(kvs: Vec<(String, Value)>) -> Self {
        Metadata(
            kvs.into_iter()
                .filter(|(_, v)| !matches!(v, Value::SkippedArray(_)))
                .collect(),
        )
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

/// A model's GGUF header, read once: its geometry and the metadata its RoPE is read from.
#[derive(Debug, Clone)]
pub struct Model {
    pub geometry: Geometry,
    /// What errors name the model by (its path).
    pub source: String,
    pub metadata: Metadata,
}

impl Model {
    /// Read a model's GGUF header (only the header) and its geometry.
    pub fn read(path: impl AsRef<Path>) -> Result<Model> {
        let path = path.as_ref();
        let kvs = read_metadata(path)?;
        Model::from_metadata(&path.display().to_string(), kvs)
    }

    /// A model from its header's `(key, value)` pairs; `source_name` names it in errors.
    pub fn from_metadata(source_name: &str, meta: Vec<(String, Value)>) -> Result<Model> {
        let metadata = Metadata::new(meta);
        let geometry = Geometry::from_metadata(source_name, &metadata)?;
        Ok(Model {
            geometry,
            source: source_name.to_string(),
            metadata,
        })
    }

    /// The RoPE of the model's layers, for K heads of `head_dim_k` values.
    pub fn rope(&self, head_dim_k: usize) -> Result<ModelRope> {
        ModelRope::from_metadata(&self.source, &self.metadata, head_dim_k)
    }
}

// -- values as kvfast's messages spell them (Python's repr) --------------------------------------

fn py_type(v: Option<&Value>) -> &'static str {
    match v {
        None | Some(Value::SkippedArray(_)) => "NoneType",
        Some(Value::Int(_)) => "int",
        Some(Value::Float(_)) => "float",
        Some(Value::Bool(_)) => "bool",
        Some(Value::Str(_)) => "str",
        Some(Value::Array(_)) => "list",
    }
}

fn py_repr(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::SkippedArray(_)) => "None".into(),
        Some(Value::Int(i)) => i.to_string(),
        Some(Value::Float(f)) => py_float(*f),
        Some(Value::Bool(b)) => if *b { "True" } else { "False" }.into(),
        Some(Value::Str(s)) => py_str(s),
        Some(Value::Array(items)) => {
            let parts: Vec<String> = items
                .iter()
                .filter(|i| !matches!(i, Value::SkippedArray(_)))
                .map(|i| py_repr(Some(i)))
                .collect();
            format!("[{}]", parts.join(", "))
        }
    }
}

/// Python's repr of a float: the shortest digits that read back, in fixed notation for exponents
/// from -4 to 15, else as `1e+16`.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    let e = format!("{f:e}");
    let (mant, exp) = e.split_once('e').expect("LowerExp has an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let (sign, mant) = match mant.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mant),
    };
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            let mut d = digits.clone();
            while d.len() < int_len {
                d.push('0');
            }
            let (int, frac) = d.split_at(int_len);
            let frac = if frac.is_empty() { "0" } else { frac };
            format!("{sign}{int}.{frac}")
        } else {
            let zeros = "0".repeat((-exp - 1) as usize);
            format!("{sign}0.{zeros}{digits}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let mant = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mant}e{esign}{:02}", exp.unsigned_abs())
    }
}

/// Python's repr of a str.
fn py_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's truth of a value (`if value:`).
fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::SkippedArray(_)) => false,
        Some(Value::Int(i)) => *i != 0,
        Some(Value::Float(f)) => *f != 0.0,
        Some(Value::Bool(b)) => *b,
        Some(Value::Str(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
    }
}

/// 4096 as "4,096".
fn commas(n: i64) -> String {
    let s = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

// -- the geometry -----------------------------------------------------------------------------------

/// More layers than any model has (the bound on a cache's n_layer): bounds block_count.
pub const MAX_MODEL_LAYERS: i64 = MAX_LAYERS as i64;
/// More values per row than any model has: bounds head sizes and counts.
pub const MAX_MODEL_VALUES: i64 = MAX_EMBD as i64;

struct Reader<'a> {
    source: &'a str,
    meta: &'a Metadata,
}

impl Reader<'_> {
    fn err(&self, key: &str, message: String) -> ModelError {
        ModelError::Metadata {
            field: key.to_string(),
            message: format!("{}: {key} {message}", self.source),
        }
    }

    fn bad(&self, key: &str, v: Option<&Value>, what: &str) -> ModelError {
        self.err(
            key,
            format!("must be {what}, found {} ({})", py_repr(v), py_type(v)),
        )
    }

    fn length(&self, key: &str, len: usize, n_layer: usize) -> ModelError {
        self.err(key, format!("has {len} entries for {n_layer} layers"))
    }

    /// An integer of the header in `lo..=hi` (a bool, a float or a string is refused).
    fn count(&self, key: &str, v: Option<&Value>, lo: i64, hi: i64) -> Result<i64> {
        match v {
            Some(Value::Int(i)) if (lo..=hi).contains(i) => Ok(*i),
            _ => Err(self.bad(key, v, &format!("an integer from {lo} to {}", commas(hi)))),
        }
    }

    fn flag(&self, key: &str, v: Option<&Value>) -> Result<bool> {
        match v {
            Some(Value::Bool(b)) => Ok(*b),
            Some(Value::Int(i @ (0 | 1))) => Ok(*i == 1),
            _ => Err(self.bad(key, v, "a bool (or 0 / 1)")),
        }
    }

    /// A per-layer count: one integer for every layer, or a list of n_layer of them.
    fn per_layer(&self, key: &str, v: Option<&Value>, n_layer: usize) -> Result<Vec<u64>> {
        if let Some(Value::Array(items)) = v {
            if items.len() != n_layer {
                return Err(self.length(key, items.len(), n_layer));
            }
            return items
                .iter()
                .enumerate()
                .map(|(il, x)| {
                    self.count(&format!("{key}[{il}]"), Some(x), 0, MAX_MODEL_VALUES)
                        .map(|c| c as u64)
                })
                .collect();
        }
        let c = self.count(key, v, 0, MAX_MODEL_VALUES)? as u64;
        Ok(vec![c; n_layer])
    }

    /// Per layer, whether llama.cpp keeps it in the recurrent part (its is_recr rule and the
    /// recurrent memory's layer filter, create_memory).
    fn recurrent(
        &self,
        arch: &str,
        n_layer: usize,
        nextn: usize,
        heads_kv: &[u64],
    ) -> Result<Option<Vec<bool>>> {
        let trunk = n_layer - nextn;
        let per = |f: &dyn Fn(usize) -> bool| Some((0..n_layer).map(f).collect());
        if arch::is_recurrent(arch) || arch == arch::FALCON_H1 {
            return Ok(per(&|il| il < trunk));
        }
        if arch::NO_KV_HEAD_IS_RECURRENT.contains(&arch) {
            return Ok(per(&|il| il < trunk && heads_kv[il] == 0));
        }
        if arch::NEMOTRON_H.contains(&arch) {
            let ff = self.feed_forward(arch, n_layer)?;
            return Ok(per(&|il| il < trunk && heads_kv[il] == 0 && ff[il] == 0));
        }
        if arch::INTERVAL.contains(&arch) {
            let name = format!("{arch}.attention.recurrent_layers");
            if let Some(listed) = self.meta.get(&name) {
                let flags = match listed {
                    Value::Array(items) => {
                        let flags = items
                            .iter()
                            .enumerate()
                            .map(|(il, x)| self.flag(&format!("{name}[{il}]"), Some(x)))
                            .collect::<Result<Vec<bool>>>()?;
                        if flags.len() != n_layer {
                            return Err(self.length(&name, items.len(), n_layer));
                        }
                        flags
                    }
                    other => vec![self.flag(&name, Some(other))?; n_layer],
                };
                return Ok(per(&|il| il < trunk && flags[il]));
            }
            let name = format!("{arch}.full_attention_interval");
            let n = match self.meta.get(&name) {
                None => 4,
                v => self.count(&name, v, 1, MAX_MODEL_LAYERS)? as usize,
            };
            return Ok(per(&|il| il < trunk && (il + 1) % n != 0));
        }
        let prefixes: Vec<String> = arch::RECURRENT_KEYS
            .iter()
            .map(|r| format!("{arch}.{r}"))
            .collect();
        if self
            .meta
            .keys()
            .any(|k| prefixes.iter().any(|p| k.starts_with(p.as_str())))
        {
            return Ok(None); // a recurrent model of an arch kvfast does not know: the bytes tell
        }
        Ok(per(&|_| false))
    }

    fn feed_forward(&self, arch: &str, n_layer: usize) -> Result<Vec<u64>> {
        let name = format!("{arch}.feed_forward_length");
        let zero = Value::Int(0);
        self.per_layer(&name, Some(self.meta.get(&name).unwrap_or(&zero)), n_layer)
    }

    /// Per layer, whether llama.cpp keeps it in the attention caches (create_memory's filters).
    fn attention(
        &self,
        arch: &str,
        n_layer: usize,
        nextn: usize,
        recurrent: Option<&[bool]>,
    ) -> Result<Option<Vec<bool>>> {
        let trunk = n_layer - nextn;
        if arch::is_recurrent(arch) {
            return Ok(Some(vec![false; n_layer]));
        }
        if arch == arch::FALCON_H1 {
            return Ok(Some(vec![true; n_layer]));
        }
        let Some(recurrent) = recurrent else {
            return Ok(None);
        };
        if arch::NEMOTRON_H.contains(&arch) {
            let ff = self.feed_forward(arch, n_layer)?;
            return Ok(Some(
                (0..n_layer)
                    .map(|il| !recurrent[il] && ff[il] == 0)
                    .collect(),
            ));
        }
        if arch::INTERVAL.contains(&arch) {
            return Ok(Some(
                (0..n_layer)
                    .map(|il| il < trunk && !recurrent[il])
                    .collect(),
            ));
        }
        if arch::NO_KV_HEAD_IS_RECURRENT.contains(&arch) {
            return Ok(Some(recurrent.iter().map(|r| !r).collect()));
        }
        // attention models: a NextN / MTP block is kept out of the main context's cache
        Ok(Some((0..n_layer).map(|il| il < trunk).collect()))
    }
}

impl Geometry {
    /// The geometry a header's metadata gives; `source_name` (the path) names it in errors.
    /// Metadata of the wrong type or out of range is a [`ModelError::Metadata`] naming the key;
    /// block_count is bounded by [`MAX_MODEL_LAYERS`], head sizes and counts by
    /// [`MAX_MODEL_VALUES`].
    pub fn from_metadata(source_name: &str, meta: &Metadata) -> Result<Geometry> {
        let r = Reader {
            source: source_name,
            meta,
        };
        let arch = match meta.get("general.architecture") {
            Some(Value::Str(s)) if !s.is_empty() => s.clone(),
            v => {
                return Err(r.bad(
                    "general.architecture",
                    v,
                    "an architecture name (a model GGUF)",
                ))
            }
        };
        let key = |name: &str| format!("{arch}.{name}");
        let name = key("block_count");
        let n_layer = r.count(&name, meta.get(&name), 1, MAX_MODEL_LAYERS)? as usize;
        let name = key("nextn_predict_layers");
        let nextn = match meta.get(&name) {
            None => 0,
            v => r.count(&name, v, 0, n_layer as i64)? as usize,
        };
        let name_h = key("attention.head_count");
        let n_head = meta.get(&name_h);
        let mut name_kv = key("attention.head_count_kv");
        let mut n_head_kv = meta.get(&name_kv);
        if n_head_kv.is_none() {
            name_kv = name_h.clone();
            n_head_kv = n_head;
        }
        let zero = Value::Int(0);
        if n_head_kv.is_none() && arch::is_recurrent(&arch) {
            n_head_kv = Some(&zero); // no attention head at all
        }
        let heads_kv = r.per_layer(&name_kv, n_head_kv, n_layer)?;
        let n_head0 = match n_head {
            Some(v) => r.per_layer(&name_h, Some(v), n_layer)?[0] as i64,
            None => 0,
        };
        let name = key("embedding_length");
        let emb = match meta.get(&name) {
            None => 0,
            v => r.count(&name, v, 0, MAX_MODEL_VALUES)?,
        };
        let recurrent = r.recurrent(&arch, n_layer, nextn, &heads_kv)?;
        let mut attention = r.attention(&arch, n_layer, nextn, recurrent.as_deref())?;
        let get = |name: &str| meta.get(&key(name)).cloned();
        if let Some(kv) = memory::kv_layers(&arch, &get, n_layer) {
            // shared-KV layers read an earlier layer's cache and have none of their own
            let a = attention.get_or_insert_with(|| vec![true; n_layer]);
            a.iter_mut().skip(kv).for_each(|x| *x = false);
        }
        let name_k = key("attention.key_length");
        let v = meta.get(&name_k);
        let no_attention = attention.as_ref().is_some_and(|a| !a.iter().any(|x| *x));
        let (head_dim_k, head_dim_v) = if v.is_none() && no_attention {
            (0, 0) // no attention layer, no head
        } else {
            let derived;
            let v = match v {
                Some(v) => v,
                None => {
                    if n_head0 == 0 || emb == 0 {
                        return Err(r.bad(
                            &name_k,
                            None,
                            "the head size (or embedding_length and head_count)",
                        ));
                    }
                    derived = Value::Int(emb / n_head0);
                    &derived
                }
            };
            let k = r.count(&name_k, Some(v), 1, MAX_MODEL_VALUES)? as u64;
            let name = key("attention.value_length");
            let v = match meta.get(&name) {
                None => k,
                v => r.count(&name, v, 1, MAX_MODEL_VALUES)? as u64,
            };
            (k, v)
        };
        let mla = |k: &str| matches!(meta.get(&key(k)), Some(Value::Int(x)) if *x > 0);
        let v_less = mla("attention.key_length_mla") && mla("attention.value_length_mla");
        let name = key("attention.sliding_window_pattern");
        let mut swa: Vec<bool> = match meta.get(&name) {
            Some(Value::Array(items)) => {
                if items.len() != n_layer {
                    return Err(r.length(&name, items.len(), n_layer));
                }
                items
                    .iter()
                    .enumerate()
                    .map(|(il, x)| r.flag(&format!("{name}[{il}]"), Some(x)))
                    .collect::<Result<_>>()?
            }
            pattern => {
                let n = match pattern {
                    None => arch::swa_pattern(&arch) as usize,
                    v => r.count(&name, v, 0, MAX_MODEL_LAYERS)? as usize,
                };
                (0..n_layer).map(|il| n > 1 && il % n < n - 1).collect()
            }
        };
        let name = key("attention.sliding_window");
        let window = meta.get(&name);
        if arch::LFM2.contains(&arch.as_str()) && truthy(window) {
            if let Some(a) = &attention {
                // LFM2 with a window: every attention layer slides (its is_swa rule)
                r.count(&name, window, 0, 1 << 31)?;
                swa = a.clone();
            }
        }
        let head_dims_swa = memory::swa_head_dims(&get, head_dim_k, head_dim_v);
        let indexer = memory::indexer(&arch, &get, n_layer, n_layer - nextn, head_dim_v);
        Ok(Geometry {
            arch,
            n_layer,
            head_dim_k,
            head_dim_v,
            n_head_kv: heads_kv,
            swa,
            recurrent,
            attention,
            v_less: Some(v_less),
            n_layer_trunk: Some(n_layer - nextn),
            head_dims_swa,
            indexer,
        })
    }

    /// What the model says about its layers, as the layer map takes it.
    pub fn layers(&self) -> ModelLayers {
        ModelLayers {
            arch: self.arch.clone(),
            n_layer: self.n_layer,
            attention: self.attention.clone(),
            swa: self.swa.clone(),
            recurrent: self.recurrent.clone(),
            indexer: self.indexer.as_ref().map(|i| {
                i.layers
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| **x)
                    .map(|(il, _)| il as i32)
                    .collect()
            }),
        }
    }

    /// What the walk cannot tell from the bytes, as the model says it: whether the caches hold V,
    /// and the recurrent part's layers (its n_layer field, the layers with records).
    pub fn walk_hints(&self) -> (Option<bool>, Option<RecurrentHint>) {
        let hint = self.recurrent.as_ref().map(|r| RecurrentHint {
            n_layer: self.n_layer_trunk.unwrap_or(self.n_layer) as u32,
            layers: r.iter().filter(|x| **x).count() as u32,
        });
        (self.v_less, hint)
    }
}

// -- the RoPE ---------------------------------------------------------------------------------------

fn rope_err(field: &str, message: String) -> ModelError {
    ModelError::Rope {
        field: field.to_string(),
        message,
    }
}

/// A finite number of the header, or `default` where the key is absent.
fn number(meta: &Metadata, key: &str, default: f64) -> Result<f64> {
    match meta.get(key) {
        None => Ok(default),
        Some(Value::Int(i)) => Ok(*i as f64),
        Some(Value::Float(f)) if f.is_finite() => Ok(*f),
        v => Err(rope_err(
            key,
            format!("{key} is {}: expected a finite number", py_repr(v)),
        )),
    }
}

fn mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

impl ModelRope {
    /// The RoPE of a model's layers from its header's metadata, for K heads of `head_dim_k`
    /// values; `source_name` names the model in errors. Computed in f64, then kept as f32.
    pub fn from_metadata(source_name: &str, meta: &Metadata, head_dim_k: usize) -> Result<Self> {
        let arch = match meta.get("general.architecture") {
            Some(Value::Str(s)) => s.as_str(),
            _ => {
                return Err(rope_err(
                    "general.architecture",
                    format!("{source_name}: no general.architecture"),
                ))
            }
        };
        let k = |name: &str| format!("{arch}.{name}");
        let maybe = arch::MAYBE_MROPE
            .iter()
            .find(|(a, _)| *a == arch)
            .map(|(_, neox)| *neox);
        let name = k("rope.dimension_sections");
        let mrope = meta.get(&name);
        let mut sections = [0u32; 4];
        if arch::MROPE.contains(&arch) || (maybe.is_some() && truthy(mrope)) {
            // M-RoPE: NEOX pairing, each section's pairs turned by the time, height or width
            // position (text cells: all the position; image cells: the cell extension's y and x)
            let bad = || {
                rope_err(
                    &name,
                    format!(
                        "{name} is {}: expected up to 4 section sizes (M-RoPE)",
                        py_repr(mrope)
                    ),
                )
            };
            let Some(Value::Array(items)) = mrope else {
                return Err(bad());
            };
            // Python's ints: a bool is one
            let given: Vec<i64> = items
                .iter()
                .filter_map(|v| match v {
                    Value::Int(i) => Some(*i),
                    Value::Bool(b) => Some(*b as i64),
                    _ => None,
                })
                .collect();
            if given.len() != items.len() || given.is_empty() || given.len() > 4 {
                return Err(bad());
            }
            if given.iter().any(|g| *g < 0 || *g > u32::MAX as i64) || given.iter().all(|g| *g == 0)
            {
                return Err(bad());
            }
            for (s, g) in sections.iter_mut().zip(&given) {
                *s = *g as u32;
            }
        }
        let neox = if arch::NORM.contains(&arch) || maybe == Some(false) {
            false
        } else if arch::NEOX.contains(&arch) || maybe.is_some() || arch::MROPE.contains(&arch) {
            true
        } else {
            return Err(rope_err(
                "general.architecture",
                format!("pre_rope: {arch} uses no RoPE kvfast knows of"),
            ));
        };
        let neox = neox || sections.iter().any(|s| *s != 0); // M-RoPE pairs halves
        let name = k("rope.dimension_count");
        let n_dims = number(meta, &name, head_dim_k as f64)?.trunc();
        if n_dims % 2.0 != 0.0 || !(n_dims > 0.0 && n_dims <= head_dim_k as f64) {
            return Err(rope_err(
                &name,
                format!(
                    "{name} is {}: expected an even count up to the head size {head_dim_k}",
                    py_int(n_dims)
                ),
            ));
        }
        let n_dims = n_dims as usize;
        if arch::ROPE_LAST.contains(&arch) && n_dims < head_dim_k {
            return Err(rope_err(
                &name,
                format!(
                    "pre_rope: {arch} ropes the last {n_dims} of {head_dim_k} K values (a k_pe part, MLA), which kvfast does not undo yet"
                ),
            ));
        }
        let base = number(meta, &k("rope.freq_base"), 10000.0)?;
        let name = k("rope.scaling.type");
        let scaling = match meta.get(&name) {
            None => "linear",
            Some(Value::Str(s)) if ["none", "linear", "yarn"].contains(&s.as_str()) => s.as_str(),
            v => {
                return Err(rope_err(
                    &name,
                    format!("pre_rope: rope scaling {} is not supported", py_repr(v)),
                ))
            }
        };
        let mut factor = number(meta, &k("rope.scaling.factor"), 0.0)?;
        if factor == 0.0 {
            factor = number(meta, &k("rope.scale_linear"), 0.0)?;
        }
        let freq_scale = if scaling == "none" || factor == 0.0 {
            1.0
        } else {
            1.0 / factor
        };
        let yarn = scaling == "yarn";
        let ext = number(meta, &k("rope.scaling.yarn_ext_factor"), -1.0)?;
        let ext = if ext < 0.0 {
            if yarn {
                1.0
            } else {
                0.0
            }
        } else {
            ext
        };
        let mut attn = number(meta, &k("rope.scaling.yarn_attn_factor"), 1.0)?;
        let log_mul = number(meta, &k("rope.scaling.yarn_log_multiplier"), 0.0)?;
        if ext != 0.0 && log_mul != 0.0 {
            let m = if arch == "deepseek2" && log_mul != 1.0 {
                log_mul
            } else {
                1.0
            };
            attn = mscale(1.0 / freq_scale, m) / mscale(1.0 / freq_scale, log_mul);
        }
        let mut name = k("rope.scaling.original_context_length");
        let mut n_ctx = number(meta, &name, 0.0)?;
        if n_ctx == 0.0 {
            name = k("context_length");
            n_ctx = number(meta, &name, 0.0)?;
        }
        let beta_fast = number(meta, &k("rope.scaling.yarn_beta_fast"), 32.0)?;
        let beta_slow = number(meta, &k("rope.scaling.yarn_beta_slow"), 1.0)?;
        let swa_default = if arch::SWA_BASE_IS_GLOBAL.contains(&arch) {
            base
        } else {
            10000.0
        };
        let swa_base = number(meta, &k("rope.freq_base_swa"), swa_default)?;
        // checked last: Python's int() took any number, set_rope refused it past u32
        let n_ctx = n_ctx.trunc();
        if !(0.0..=u32::MAX as f64).contains(&n_ctx) {
            return Err(rope_err(
                &name,
                format!(
                    "{name} is {}: expected a context length from 0 to 4,294,967,295",
                    py_int(n_ctx)
                ),
            ));
        }
        let global = Rope {
            n_dims,
            head_dim: head_dim_k,
            freq_base: base as f32,
            freq_scale: freq_scale as f32,
            neox,
            ext_factor: ext as f32,
            attn_factor: attn as f32,
            beta_fast: beta_fast as f32,
            beta_slow: beta_slow as f32,
            n_ctx_orig: n_ctx as u32,
            sections,
            imrope: arch::IMROPE.contains(&arch),
        };
        let swa = Rope {
            freq_base: swa_base as f32,
            freq_scale: 1.0,
            ..global
        };
        Ok(ModelRope { global, swa })
    }
}

/// A whole number held in an f64 as Python's `int(float)` prints it (every digit, exactly).
fn py_int(f: f64) -> String {
    if f.abs() < 9.007_199_254_740_992e15 {
        (f as i64).to_string()
    } else {
        format!("{f:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(arch: &str, kvs: &[(&str, Value)]) -> Vec<(String, Value)> {
        let mut v = vec![("general.architecture".to_string(), Value::Str(arch.into()))];
        v.extend(kvs.iter().map(|(k, x)| (format!("{arch}.{k}"), x.clone())));
        v
    }

    fn ints(xs: &[i64]) -> Value {
        Value::Array(xs.iter().map(|x| Value::Int(*x)).collect())
    }

    fn geometry(arch: &str, kvs: &[(&str, Value)]) -> Result<Geometry> {
        Model::from_metadata("m.gguf", meta(arch, kvs)).map(|m| m.geometry)
    }

    fn metadata_err(e: ModelError) -> (String, String) {
        match e {
            ModelError::Metadata { field, message } => (field, message),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn gemma3_slides_five_layers_of_six() {
        let g = geometry(
            "gemma3",
            &[
                ("block_count", Value::Int(8)),
                ("attention.head_count", Value::Int(4)),
                ("attention.head_count_kv", Value::Int(1)),
                ("attention.key_length", Value::Int(256)),
            ],
        )
        .unwrap();
        assert_eq!(
            g.swa,
            [true, true, true, true, true, false, true, true].to_vec()
        );
        assert_eq!((g.head_dim_k, g.head_dim_v), (256, 256));
        assert_eq!(g.n_head_kv, vec![1; 8]);
        assert_eq!(g.recurrent, Some(vec![false; 8]));
        assert_eq!(g.attention, Some(vec![true; 8]));
        assert_eq!(g.v_less, Some(false));
        assert_eq!(
            g.walk_hints().1.map(|h| (h.n_layer, h.layers)),
            Some((8, 0))
        );
    }

    #[test]
    fn qwen35_every_fourth_layer_attends() {
        let kvs = [
            ("block_count", Value::Int(9)),
            ("nextn_predict_layers", Value::Int(1)),
            ("attention.head_count", Value::Int(4)),
            ("attention.head_count_kv", Value::Int(2)),
            ("attention.key_length", Value::Int(64)),
        ];
        let g = geometry("qwen35", &kvs).unwrap();
        let rec: Vec<bool> = (0..9).map(|il| il < 8 && (il + 1) % 4 != 0).collect();
        let att: Vec<bool> = (0..9).map(|il| il < 8 && (il + 1) % 4 == 0).collect();
        assert_eq!(g.recurrent.as_deref(), Some(&rec[..]));
        assert_eq!(g.attention.as_deref(), Some(&att[..]));
        assert_eq!(g.n_layer_trunk, Some(8));
        let (_, hint) = g.walk_hints();
        assert_eq!(hint.map(|h| (h.n_layer, h.layers)), Some((8, 6)));
        assert_eq!(g.layers().attention_layers(), vec![3, 7]);
        // a list of recurrent layers wins; of the wrong length, it names the key
        let mut listed = kvs.to_vec();
        listed.push((
            "attention.recurrent_layers",
            Value::Array(vec![Value::Bool(true); 8]),
        ));
        let (field, msg) = metadata_err(geometry("qwen35", &listed).unwrap_err());
        assert_eq!(field, "qwen35.attention.recurrent_layers");
        assert_eq!(
            msg,
            "m.gguf: qwen35.attention.recurrent_layers has 8 entries for 9 layers"
        );
    }

    #[test]
    fn nemotron_h_keeps_its_mlp_layers_in_neither() {
        let g = geometry(
            "nemotron_h",
            &[
                ("block_count", Value::Int(4)),
                ("attention.head_count", Value::Int(4)),
                ("attention.head_count_kv", ints(&[0, 2, 0, 0])),
                ("feed_forward_length", ints(&[0, 0, 64, 0])),
                ("attention.key_length", Value::Int(32)),
            ],
        )
        .unwrap();
        assert_eq!(g.recurrent, Some(vec![true, false, false, true]));
        assert_eq!(g.attention, Some(vec![false, true, false, false]));
    }

    #[test]
    fn an_mla_model_holds_k_only_and_falcon_h1_every_layer_twice() {
        let g = geometry(
            "deepseek2",
            &[
                ("block_count", Value::Int(2)),
                ("attention.head_count", Value::Int(4)),
                ("attention.head_count_kv", Value::Int(1)),
                ("attention.key_length", Value::Int(576)),
                ("attention.value_length", Value::Int(512)),
                ("attention.key_length_mla", Value::Int(192)),
                ("attention.value_length_mla", Value::Int(128)),
            ],
        )
        .unwrap();
        assert_eq!(g.v_less, Some(true));
        assert_eq!((g.head_dim_k, g.head_dim_v), (576, 512));
        let g = geometry(
            "falcon-h1",
            &[
                ("block_count", Value::Int(3)),
                ("attention.head_count", Value::Int(4)),
                ("embedding_length", Value::Int(256)),
            ],
        )
        .unwrap();
        assert_eq!(g.recurrent, Some(vec![true; 3]));
        assert_eq!(g.attention, Some(vec![true; 3]));
        assert_eq!(g.head_dim_k, 64); // embedding_length / head_count
                                      // an unknown arch with recurrent hyperparameters: not known
        let g = geometry(
            "futurenet",
            &[
                ("block_count", Value::Int(2)),
                ("attention.head_count", Value::Int(4)),
                ("attention.key_length", Value::Int(16)),
                ("ssm.state_size", Value::Int(16)),
            ],
        )
        .unwrap();
        assert_eq!((g.recurrent, g.attention), (None, None));
    }

    #[test]
    fn lfm2_with_a_window_slides_every_attention_layer() {
        let g = geometry(
            "lfm2",
            &[
                ("block_count", Value::Int(4)),
                ("attention.head_count", Value::Int(4)),
                ("attention.head_count_kv", ints(&[0, 2, 0, 2])),
                ("attention.key_length", Value::Int(32)),
                ("attention.sliding_window", Value::Int(512)),
            ],
        )
        .unwrap();
        assert_eq!(g.swa, vec![false, true, false, true]);
        assert_eq!(g.recurrent, Some(vec![true, false, true, false]));
    }

    #[test]
    fn bad_keys_name_their_field_as_kvfast_always_said() {
        let base = [
            ("attention.head_count", Value::Int(4)),
            ("attention.head_count_kv", Value::Int(2)),
            ("attention.key_length", Value::Int(32)),
        ];
        let with = |k: &'static str, v: Value| {
            let mut kvs = vec![("block_count", Value::Int(2))];
            kvs.extend(base.iter().cloned());
            kvs.retain(|(key, _)| *key != k);
            kvs.push((k, v));
            metadata_err(geometry("qwen3", &kvs).unwrap_err())
        };
        assert_eq!(
            with("block_count", Value::Int(1 << 31)),
            (
                "qwen3.block_count".into(),
                "m.gguf: qwen3.block_count must be an integer from 1 to 4,096, found 2147483648 (int)"
                    .into()
            )
        );
        assert_eq!(
            with("attention.key_length", Value::Bool(true)).1,
            "m.gguf: qwen3.attention.key_length must be an integer from 1 to 16,777,216, found True (bool)"
        );
        assert_eq!(
            with("attention.key_length", Value::Float(32.900001525878906)).1,
            "m.gguf: qwen3.attention.key_length must be an integer from 1 to 16,777,216, found 32.900001525878906 (float)"
        );
        assert_eq!(
            with("attention.head_count_kv", Value::Str("2".into())).1,
            "m.gguf: qwen3.attention.head_count_kv must be an integer from 0 to 16,777,216, found '2' (str)"
        );
        assert_eq!(
            with("attention.head_count_kv", ints(&[2, 2, 2])).1,
            "m.gguf: qwen3.attention.head_count_kv has 3 entries for 2 layers"
        );
        assert_eq!(
            with("attention.head_count_kv", ints(&[2, -1])).0,
            "qwen3.attention.head_count_kv[1]"
        );
        let (field, msg) = metadata_err(Model::from_metadata("m.gguf", vec![]).unwrap_err());
        assert_eq!(field, "general.architecture");
        assert_eq!(
            msg,
            "m.gguf: general.architecture must be an architecture name (a model GGUF), found None (NoneType)"
        );
    }

    #[test]
    fn python_spellings() {
        assert_eq!(py_float(32.0), "32.0");
        assert_eq!(py_float(1e16), "1e+16");
        assert_eq!(py_float(1.5e-5), "1.5e-05");
        assert_eq!(py_float(0.0001), "0.0001");
        assert_eq!(py_float(-0.0), "-0.0");
        assert_eq!(py_float(123456.789), "123456.789");
        assert_eq!(py_float(1e100), "1e+100");
        assert_eq!(py_float(f64::NAN), "nan");
        assert_eq!(py_str("it's"), "\"it's\"");
        assert_eq!(py_str("a\nb'\""), "'a\\nb\\'\"'");
        assert_eq!(commas(16_777_216), "16,777,216");
        assert_eq!(commas(2), "2");
        assert_eq!(commas(100), "100");
        assert_eq!(commas(1000), "1,000");
    }

    #[test]
    fn the_rope_of_a_yarn_model_and_its_errors() {
        let kvs = [
            ("block_count", Value::Int(2)),
            ("attention.head_count", Value::Int(4)),
            ("attention.key_length", Value::Int(128)),
            ("rope.freq_base", Value::Float(1e6)),
            ("rope.scaling.type", Value::Str("yarn".into())),
            ("rope.scaling.factor", Value::Float(4.0)),
            ("rope.scaling.original_context_length", Value::Int(32768)),
        ];
        let m = Model::from_metadata("m.gguf", meta("qwen3", &kvs)).unwrap();
        let r = m.rope(128).unwrap();
        assert!(r.global.neox && r.global.n_dims == 128 && r.global.n_ctx_orig == 32768);
        assert_eq!((r.global.freq_scale, r.global.ext_factor), (0.25, 1.0));
        assert_eq!((r.global.freq_base, r.swa.freq_base), (1e6, 10000.0));
        assert_eq!(r.swa.freq_scale, 1.0);
        let mut bad = kvs.to_vec();
        bad.push(("rope.freq_base", Value::Str("x".into())));
        let e = Model::from_metadata("m.gguf", meta("qwen3", &bad))
            .unwrap()
            .rope(128)
            .unwrap_err();
        assert_eq!(e.field(), Some("qwen3.rope.freq_base"));
        assert_eq!(
            e.to_string(),
            "qwen3.rope.freq_base is 'x': expected a finite number"
        );
        let deepseek = ModelRope::from_metadata(
            "m.gguf",
            &Metadata::new(meta(
                "deepseek2",
                &[("rope.dimension_count", Value::Int(64))],
            )),
            192,
        )
        .unwrap_err();
        assert_eq!(deepseek.field(), Some("deepseek2.rope.dimension_count"));
        assert!(deepseek
            .to_string()
            .contains("ropes the last 64 of 192 K values"));
        let mamba = ModelRope::from_metadata("m.gguf", &Metadata::new(meta("mamba", &[])), 64);
        assert_eq!(
            mamba.unwrap_err().to_string(),
            "pre_rope: mamba uses no RoPE kvfast knows of"
        );
        let vl = ModelRope::from_metadata(
            "m.gguf",
            &Metadata::new(meta(
                "qwen2vl",
                &[("rope.dimension_sections", ints(&[4, 6, 6]))],
            )),
            32,
        )
        .unwrap();
        assert_eq!(vl.global.sections, [4, 6, 6, 0]);
        assert!(vl.global.neox && !vl.global.imrope);
    }

    fn model_file(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data/models")
            .join(name)
    }

    #[test]
    fn real_models() {
        let q = Model::read(model_file("tiny-qwen3.gguf")).unwrap();
        assert_eq!(q.geometry.arch, "qwen3");
        assert_eq!((q.geometry.head_dim_k, q.geometry.head_dim_v), (32, 32));
        assert_eq!(q.geometry.attention, Some(vec![true; q.geometry.n_layer]));
        let r = q.rope(32).unwrap();
        assert!(r.global.neox && r.global.n_dims == 32 && r.global.freq_scale == 1.0);
        let m = Model::read(model_file("tiny-mamba2.gguf"))
            .unwrap()
            .geometry;
        assert_eq!(m.attention, Some(vec![false; m.n_layer]));
        assert_eq!(m.recurrent, Some(vec![true; m.n_layer]));
        assert_eq!(m.head_dim_k, 0);
        let d = Model::read(model_file("tiny-deepseek2-mla.gguf")).unwrap();
        assert_eq!(d.geometry.v_less, Some(true));
        let s = Model::read(model_file("tiny-lfm2-swa.gguf"))
            .unwrap()
            .geometry;
        assert_eq!(Some(s.swa.clone()), s.attention);
        let missing = Model::read(model_file("no-such.gguf")).unwrap_err();
        assert!(matches!(missing, ModelError::Read(_)));
    }
}
