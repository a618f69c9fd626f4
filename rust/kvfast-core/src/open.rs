//! Opening a state: everything a pass needs decided once, from the walked bytes and the options.
//!
//! [`Opened::new`] takes a walked [`State`] and every open option (head size or the model's
//! geometry, rotation mode, keys before RoPE) and returns an immutable opened state: the model
//! layer of every cache layer, the model's fit checked, the rotation decision with its evidence
//! (a sample of rows, never a whole record), the RoPE to undo. Every later pass takes its
//! [`Selection`] from [`Opened::selection`] instead of assembling one.

use crate::format::layout::{Kind, Layout};
use crate::format::types::GgmlType;
use crate::model::geometry::{Geometry, ModelError};
use crate::model::layer_map::{fit as fit_layers, Fit, LayerMap, MapError, Partial};
use crate::model::memory::{Basis, Part, Role};
use crate::plan::select::Selection;
use crate::source::state::State;
use crate::values::rope::{Rope, RopeSpec};
use crate::values::rotation::rule_group;
use crate::values::rotation_decide::{
    decide, sample_ranges, warning, BuildHint, Decision, Mode, Notice, RotationError,
};

/// The RoPE of the model's full-attention and sliding-window layers, given its K head size.
pub type RopeOf<'a> = &'a (dyn Fn(u64) -> Result<[Rope; 2], OpenError> + Sync);

/// Every open option but the source and how its bytes are walked.
#[derive(Clone, Copy)]
pub struct OpenOptions<'a> {
    /// Values per head, where no model gives them (None: one head spans the row).
    pub head_dim: Option<u64>,
    /// The model's geometry (from its GGUF, [`crate::model::geometry::Model::read`]).
    pub model: Option<&'a Geometry>,
    pub rotation: Mode,
    /// What the build that wrote the state recorded about the rotation (a probe manifest).
    pub hint: Option<&'a BuildHint>,
    /// Read keys before RoPE, with the model's RoPE (None: `pre_rope` was not asked for).
    pub pre_rope: Option<Option<RopeOf<'a>>>,
}

impl Default for OpenOptions<'_> {
    fn default() -> Self {
        OpenOptions {
            head_dim: None,
            model: None,
            rotation: Mode::Auto,
            hint: None,
            pre_rope: None,
        }
    }
}

/// Why a state cannot be opened as asked (its bytes read: those errors are [`crate::Error`]).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The bytes (a remote state's sampled rows included).
    #[error(transparent)]
    Read(#[from] crate::Error),
    /// The model's layers do not fit the caches.
    #[error(transparent)]
    Map(#[from] MapError),
    /// The model's head sizes or KV heads do not fit the rows, or its metadata is not what a
    /// model's is (`field`: the GGUF key).
    #[error("{message}")]
    Model {
        message: String,
        field: Option<String>,
    },
    /// A head size that does not divide the rows.
    #[error("{0}")]
    Selection(String),
    #[error(transparent)]
    Rotation(#[from] RotationError),
    /// Keys before RoPE cannot be given (`field`: the GGUF key or argument).
    #[error("{message}")]
    Rope {
        message: String,
        field: Option<String>,
    },
    /// An error of the caller's own (the binding's RoPE source raising), kept as it is.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl From<ModelError> for OpenError {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Read(e) => OpenError::Read(e),
            ModelError::Metadata { field, message } => OpenError::Model {
                message,
                field: Some(field),
            },
            ModelError::Rope { field, message } => OpenError::Rope {
                message,
                field: Some(field),
            },
        }
    }
}

impl OpenError {
    pub fn rope(message: impl Into<String>, field: Option<&str>) -> Self {
        OpenError::Rope {
            message: message.into(),
            field: field.map(str::to_string),
        }
    }
}

/// A state with everything decided: what every pass reads it in.
pub struct Opened {
    pub state: State,
    /// Values per K and V head (None: one head spans the row).
    pub head_dims: [Option<u64>; 2],
    /// Per cache (the recurrent part last), the model layer of each cache layer.
    pub model_layers: LayerMap,
    /// Per cache (the recurrent part last), what part of the model's memory it is: its role, model
    /// layers, head sizes and K basis (None: not known without the model).
    pub parts: Vec<Option<Part>>,
    /// What of the model's memory the state lacks: Some for a state written with
    /// `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY` (a hybrid's recurrent part, an iSWA model's
    /// sliding-window cache); None for the whole memory, or without the model (the bytes do not
    /// say).
    pub partial: Option<Partial>,
    /// Per attention cache and kind, whether the rotation is undone and why.
    pub rotation: Vec<Decision>,
    /// Why some decision is a default taken for want of evidence (None: none is).
    pub rotation_warning: Option<Notice>,
    /// Per cache and layer, the RoPE undone in K rows (empty: keys as stored).
    pub rope: RopeSpec,
    /// Per cache, the [K, V] groups the rotation is undone in (0: as stored).
    groups: Vec<[usize; 2]>,
}

impl Opened {
    /// The byte ranges [`Opened::new`] reads besides what the walk read (a remote state fetches
    /// them first).
    pub fn reads(layout: &Layout, opts: &OpenOptions) -> Vec<(u64, u64)> {
        if opts.rotation == Mode::None || layout.rows_on_device {
            return vec![];
        }
        sample_ranges(layout)
    }

    pub fn new(state: State, opts: OpenOptions) -> Result<Opened, OpenError> {
        let layout = &state.layout;
        let head_dims = match opts.model {
            Some(m) => [m.head_dim_k, m.head_dim_v].map(|h| (h > 0).then_some(h)),
            None => [opts.head_dim; 2],
        };
        if let Some(m) = opts.model {
            same_model(layout, m)?;
            read_memory(m)?;
        }
        let fitted = fit_layers(layout, opts.model.map(Geometry::layers).as_ref())?;
        let parts = parts(&fitted, opts.model, head_dims);
        let cache_dims: Vec<[Option<u64>; 2]> = parts
            .iter()
            .map(|p| p.as_ref().map_or(head_dims, |p| p.head_dims))
            .collect();
        let bases: Vec<Basis> = parts
            .iter()
            .map(|p| p.as_ref().map_or(Basis::Rule, |p| p.k_basis))
            .collect();
        let (model_layers, partial) = (fitted.map, fitted.partial);
        if let Some(m) = opts.model {
            fit(layout, m, &parts, opts.head_dim)?;
        }
        check_rows(layout, &cache_dims)?;
        for (offset, len) in Self::reads(layout, &opts) {
            state.require(offset, len, || {
                "rows sampled for the rotation decision".into()
            })?;
        }
        // rows kept on the device: no value to read, nothing to decide
        let rotation = if layout.rows_on_device {
            vec![]
        } else {
            decide(&state, &cache_dims, &bases, opts.rotation, opts.hint)?
        };
        let mut groups = vec![[0usize; 2]; layout.caches.len()];
        for d in &rotation {
            groups[d.cache][d.kind.index()] = d.group.unwrap_or(0);
        }
        let rope = match opts.pre_rope {
            None => vec![],
            Some(rope_of) => rope_spec(layout, opts.model, head_dims[0], &model_layers, rope_of)?,
        };
        Ok(Opened {
            rotation_warning: warning(&rotation),
            state,
            head_dims,
            model_layers,
            parts,
            partial,
            rotation,
            rope,
            groups,
        })
    }

    /// Per cache, the [K, V] groups the rotation is undone in (0: as stored).
    pub fn rotation_groups(&self) -> &[[usize; 2]] {
        &self.groups
    }

    /// The group llama.cpp stores `kind` rows of type `ty` of cache `cache` in (0: as computed),
    /// by its rule in this state's head sizes (None: that depends on a head size not known).
    /// A part of the memory that stores its K in one basis at every type (a DSA indexer cache:
    /// rotated; its MLA cache: as computed) is stored so whatever the type.
    pub fn rule_group(&self, cache: usize, kind: Kind, ty: GgmlType) -> Option<usize> {
        let part = self.parts.get(cache).and_then(Option::as_ref);
        match (kind, part.map(|p| p.k_basis)) {
            (Kind::K, Some(Basis::Rotated(g))) => return Some(g),
            (Kind::K, Some(Basis::AsComputed)) => return Some(0),
            _ => {}
        }
        let head_dim = part.map_or(self.head_dims[kind.index()], |p| p.head_dims[kind.index()]);
        rule_group(&self.state.layout, cache, kind, ty, head_dim)
    }

    /// The selection of a pass over these caches, layers, kinds and heads (None: all), in the
    /// state's head sizes, rotation and RoPE.
    pub fn selection(
        &self,
        caches: Option<Vec<u32>>,
        layers: Option<Vec<u32>>,
        kinds: Vec<Kind>,
        heads: Option<Vec<u32>>,
    ) -> Selection {
        Selection {
            caches,
            layers,
            kinds,
            heads,
            head_dim_k: self.head_dims[0],
            head_dim_v: self.head_dims[1],
            cache_head_dims: self
                .parts
                .iter()
                .map(|p| p.as_ref().map_or([None; 2], |p| p.head_dims))
                .collect(),
            rotation: self.groups.clone(),
            rope: self.rope.clone(),
        }
    }

    /// [`Opened::selection`] of every record, K then V.
    pub fn everything(&self) -> Selection {
        self.selection(None, None, Kind::BOTH.to_vec(), None)
    }
}

/// Per cache, the part of the model's memory it is (see [`crate::model::memory`]): its role and
/// model layers from the fit, its head sizes and K basis from the model (without the model: the
/// head size given, or one head per row).
fn parts(fitted: &Fit, model: Option<&Geometry>, head_dims: [Option<u64>; 2]) -> Vec<Option<Part>> {
    fitted
        .roles
        .iter()
        .zip(&fitted.map)
        .map(|(role, layers)| {
            let (role, layers) = ((*role)?, layers.clone()?);
            let some = |h: u64| (h > 0).then_some(h);
            let (dims, k_basis) = match (model, role) {
                (_, Role::Recurrent) => ([None; 2], Basis::Rule),
                (Some(m), Role::Indexer) => match &m.indexer {
                    Some(i) => ([some(i.head_dim_k), i.head_dim_v], i.k_basis),
                    None => (head_dims, Basis::Rule),
                },
                (Some(m), Role::SlidingWindow) => (
                    m.head_dims_swa
                        .map_or(head_dims, |[k, v]| [some(k), some(v)]),
                    Basis::Rule,
                ),
                // a DSA memory's MLA cache is written by its K-only attention, which never rotates
                (Some(m), Role::Attention) if m.indexer.is_some() && m.v_less == Some(true) => {
                    (head_dims, Basis::AsComputed)
                }
                _ => (head_dims, Basis::Rule),
            };
            // an MLA cache holds K only
            let mla = model.is_some_and(|m| m.v_less == Some(true)) && role != Role::Indexer;
            let dims = if mla { [dims[0], None] } else { dims };
            Some(Part {
                role,
                model_layers: layers,
                head_dims: dims,
                k_basis,
            })
        })
        .collect()
}

/// A model whose memory kvfast does not read yet (DeepSeek V4, dots3note, the hybrids with an
/// indexer) is refused in one line naming it: checked before its state's bytes are walked with it.
pub fn read_memory(m: &Geometry) -> Result<(), OpenError> {
    match crate::model::memory::unread(&m.arch) {
        None => Ok(()),
        Some(what) => Err(OpenError::Model {
            message: format!(
                "the model ({}) keeps {what}, which kvfast does not read yet",
                m.arch
            ),
            field: Some("general.architecture".into()),
        }),
    }
}

/// The model's head sizes and KV heads against every attention layer's rows.
/// The state is of the model's architecture: a whole state names its own (checked before the
/// layers, which a model of another arch may fit by chance, as a partial state with made-up
/// model layers); cells carrying M-RoPE's extension are of a model with M-RoPE.
fn same_model(layout: &Layout, m: &Geometry) -> Result<(), OpenError> {
    let mismatch = |message: String| OpenError::Model {
        message,
        field: Some("general.architecture".into()),
    };
    if let Some(a) = layout.arch.as_deref() {
        if a != m.arch {
            return Err(mismatch(format!(
                "the state was written by a {a} model, the model given is a {} model: open it \
                 with its own model",
                m.arch
            )));
        }
    }
    let arch = m.arch.as_str();
    let mrope = crate::model::arch::MROPE.contains(&arch)
        || crate::model::arch::MAYBE_MROPE
            .iter()
            .any(|(a, _)| *a == arch);
    let ext = layout
        .attention()
        .flat_map(|c| &c.streams)
        .any(|s| s.ext.is_some() && s.cell_count > 0);
    if ext && !mrope {
        return Err(mismatch(format!(
            "the state's cells carry M-RoPE's position extension, the model given ({arch}) has no \
             M-RoPE: open it with its own model"
        )));
    }
    Ok(())
}

fn fit(
    layout: &Layout,
    m: &Geometry,
    parts: &[Option<Part>],
    head_dim: Option<u64>,
) -> Result<(), OpenError> {
    if let Some(hd) = head_dim {
        if hd != m.head_dim_k {
            return Err(OpenError::Model {
                message: format!(
                    "head_dim={hd} but the model's key_length is {}",
                    m.head_dim_k
                ),
                field: None,
            });
        }
    }
    for (ci, cache) in layout.caches.iter().enumerate() {
        if cache.memory.is_recurrent() {
            continue;
        }
        let Some(Some(part)) = parts.get(ci) else {
            continue;
        };
        let layers = &part.model_layers;
        for s in &cache.streams {
            for (li, l) in s.layers.iter().enumerate() {
                let Some(&ml) = layers.get(li) else { continue };
                // an indexer cache has one head; the others the model's KV heads of the layer
                let n = match part.role {
                    Role::Indexer => 1,
                    _ => m.n_head_kv.get(ml as usize).copied().unwrap_or(0),
                };
                for kind in Kind::BOTH {
                    let Some(r) = l.record(kind) else { continue };
                    let dim = part.head_dims[kind.index()].unwrap_or(0);
                    if r.n_embd != n * dim {
                        let message = format!(
                            "model layer {ml}: the model has {n} KV heads x {dim} = {} values per {} \
                             row, the state has {}",
                            n * dim,
                            kind.name().to_uppercase(),
                            r.n_embd
                        );
                        return Err(OpenError::Model {
                            message,
                            field: None,
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

/// Every K row splits into whole heads of its cache's K head size, every V row of the V one.
fn check_rows(layout: &Layout, cache_dims: &[[Option<u64>; 2]]) -> Result<(), OpenError> {
    for (ci, c) in layout.caches.iter().enumerate() {
        if c.memory.is_recurrent() {
            continue;
        }
        let head_dims = cache_dims.get(ci).copied().unwrap_or([None; 2]);
        for s in &c.streams {
            for (li, l) in s.layers.iter().enumerate() {
                for kind in Kind::BOTH {
                    let (Some(r), Some(hd)) = (l.record(kind), head_dims[kind.index()]) else {
                        continue;
                    };
                    if hd == 0 || r.n_embd % hd != 0 {
                        return Err(OpenError::Selection(format!(
                            "head_dim {hd} does not divide the {} values per {} row of cache {ci} \
                             layer {li}",
                            r.n_embd,
                            kind.name().to_uppercase()
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Per attention cache and layer, the RoPE of its model layer (the sliding-window one for
/// sliding-window layers), checked against the K rows.
fn rope_spec(
    layout: &Layout,
    model: Option<&Geometry>,
    head_dim_k: Option<u64>,
    map: &LayerMap,
    rope_of: Option<RopeOf>,
) -> Result<RopeSpec, OpenError> {
    let (Some(model), Some(hd), Some(rope_of)) = (model, head_dim_k, rope_of) else {
        return Err(OpenError::rope(
            "pre_rope=True needs the model's GGUF (model=PATH; --model on the command line): the \
             rope parameters and head size are in its header",
            Some("model"),
        ));
    };
    let attention: Vec<_> = layout.attention().collect();
    let every: Vec<_> = attention
        .iter()
        .flat_map(|c| &c.streams)
        .flat_map(|s| &s.layers)
        .collect();
    if !every.is_empty() && every.iter().all(|l| l.v.is_none()) {
        // deepseek2's K row is the latent, then the roped part (k_pe) last: not a head roped from
        // its first values
        return Err(OpenError::rope(
            "pre_rope: a V-less (MLA) cache's K row is the compressed latent, then the RoPE part; \
             kvfast does not undo that rope yet",
            Some("model"),
        ));
    }
    let [global, swa] = rope_of(hd)?;
    let mut spec = vec![];
    for (ci, cache) in attention.iter().enumerate() {
        let Some(Some(layers)) = map.get(ci) else {
            return Err(OpenError::rope(
                "pre_rope: the model's layer map of this state is not known",
                Some("model"),
            ));
        };
        let mut row = vec![];
        for (li, &ml) in layers.iter().enumerate() {
            let slides = model.swa.get(ml as usize).copied().unwrap_or(false);
            let r = if slides { swa } else { global };
            let n_embd = cache
                .streams
                .iter()
                .find_map(|s| s.layers.get(li).map(|l| l.k.n_embd));
            let fits = n_embd.is_some_and(|n| r.head_dim > 0 && n % r.head_dim as u64 == 0);
            if !fits || r.n_dims % 2 != 0 || r.n_dims > r.head_dim {
                return Err(OpenError::rope(
                    format!(
                        "cache {ci} layer {li}: RoPE of {} dimensions in heads of {} does not fit K \
                         rows of {n_embd:?} values",
                        r.n_dims, r.head_dim
                    ),
                    None,
                ));
            }
            let finite = [r.freq_base, r.freq_scale, r.attn_factor, r.ext_factor]
                .iter()
                .all(|v| v.is_finite());
            if !finite || r.freq_base <= 0.0 || r.freq_scale <= 0.0 || r.attn_factor == 0.0 {
                return Err(OpenError::rope(
                    format!(
                        "cache {ci} layer {li}: RoPE base, scale and factors must be finite and \
                         positive"
                    ),
                    None,
                ));
            }
            row.push(Some(r));
        }
        spec.push(row);
    }
    Ok(spec)
}

/// An opened state reads as its walked state: its bytes and layout.
impl std::ops::Deref for Opened {
    type Target = State;

    fn deref(&self) -> &State {
        &self.state
    }
}
