//! What a llama.cpp memory is made of, decided once from the model's GGUF header by llama.cpp's
//! own rules (`llama_model::create_memory` and the caches it builds): its parts, each with its role,
//! its model layers, its head geometry and the basis its K rows are stored in.
//!
//! A memory is written part after part: the attention cache (an iSWA model: the full-attention
//! layers' cache, then the sliding-window layers'), the recurrent part, and for the sparse
//! attentions an indexer cache:
//! - DSA (`deepseek32`, `glm-dsa`, `hy_v4` with `indexer.top_k > 0`): the MLA cache, then the
//!   lightning indexer's K-only cache (one head of `indexer.key_length`) on the layers that have an
//!   indexer. Its K is stored multiplied by the Hadamard matrix at every type for `deepseek32`,
//!   `deepseek4`, `glm-dsa`, `dots3note` (`llama-kv-cache.cpp`: `attn_rot_k` forced), not `hy_v4`.
//! - MSA (`minimax-m3`): the main cache, then an indexer cache of one K head of
//!   `indexer.key_length` and one V head of the model's V size (never written) on the layers past
//!   `leading_dense_block_count`; its K is stored as computed.
//! - Shared-KV layers (`gemma4`, `gemma3n`: `attention.shared_kv_layers`) have no cache of their
//!   own, and Gemma 4's sliding-window cache has its own head size (`key_length_swa`).
//!
//! Memories kvfast does not read yet are named here too ([`unread`]), so that a state of one is
//! refused in one line rather than misread.

use crate::model::gguf::Value;

/// What a part of a memory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A full-attention KV cache (every attention layer of a model with no sliding window).
    Attention,
    /// The sliding-window layers' KV cache of an iSWA model.
    SlidingWindow,
    /// A sparse attention's indexer cache (DSA's lightning indexer, MSA's block indexer).
    Indexer,
    /// The recurrent part (conv / SSM states).
    Recurrent,
}

impl Role {
    /// "attention", "sliding-window", "indexer" or "recurrent", as tables and `info` name it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Attention => "attention",
            Role::SlidingWindow => "sliding-window",
            Role::Indexer => "indexer",
            Role::Recurrent => "recurrent",
        }
    }
}

/// How a part's K rows are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// By llama.cpp's rule for attention caches (a quantized cache may be Hadamard-rotated).
    Rule,
    /// Multiplied by the Hadamard matrix in groups of this many values, at every type.
    Rotated(usize),
    /// As computed, at every type.
    AsComputed,
}

/// A sparse attention's indexer cache, as the model describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Indexer {
    /// Per model layer, whether the indexer cache holds it.
    pub layers: Vec<bool>,
    /// Values of its one K head (`indexer.key_length`).
    pub head_dim_k: u64,
    /// Values of its one V head (None: the cache holds K only).
    pub head_dim_v: Option<u64>,
    pub k_basis: Basis,
}

/// The archs whose lightning indexer K is stored Hadamard-rotated at every type.
pub const ROTATED_INDEXER: [&str; 4] = ["deepseek32", "deepseek4", "glm-dsa", "dots3note"];
/// The archs of a DSA memory (an MLA cache, then a K-only indexer cache).
pub const DSA: [&str; 3] = ["deepseek32", "glm-dsa", "hy_v4"];
/// GLM 5.2's indexer layers when its GGUF lists none (`GLM_5_2_DEFAULT_INDEXER_TYPES`): layers 0
/// and 1, then every fourth from 2, up to 78.
fn glm52_default(il: usize) -> bool {
    il < 78 && (il < 2 || (il - 2) % 4 == 0)
}

/// The group llama.cpp rotates a K head of `head_dim` values in: the largest power of two >= 64
/// dividing it (`build_input_k_rot`); 0 where 64 does not divide it.
pub fn k_rotation_group(head_dim: u64) -> usize {
    if head_dim == 0 || head_dim % 64 != 0 {
        return 0;
    }
    let mut n = 64u64;
    while head_dim % (n * 2) == 0 {
        n *= 2;
    }
    n as usize
}

fn int(v: Option<&Value>) -> Option<i64> {
    match v {
        Some(Value::Int(i)) => Some(*i),
        Some(Value::Bool(b)) => Some(*b as i64),
        _ => None,
    }
}

fn flags(v: Option<&Value>, n: usize) -> Option<Vec<bool>> {
    match v {
        Some(Value::Array(items)) => Some(
            (0..n)
                .map(|i| items.get(i).and_then(|x| int(Some(x))).unwrap_or(0) != 0)
                .collect(),
        ),
        Some(x) => int(Some(x)).map(|f| vec![f != 0; n]),
        None => None,
    }
}

/// The indexer cache of `arch`'s memory (None: the memory has none). `get` reads a key of the
/// arch (`attention.indexer.key_length`); `trunk` is block_count less the NextN layers;
/// `head_dim_v` the model's V head size.
pub fn indexer(
    arch: &str,
    get: &dyn Fn(&str) -> Option<Value>,
    n_layer: usize,
    trunk: usize,
    head_dim_v: u64,
) -> Option<Indexer> {
    let head = int(get("attention.indexer.key_length").as_ref())
        .filter(|h| *h > 0)
        .map(|h| h as u64)?;
    let types = flags(get("attention.indexer.types").as_ref(), n_layer);
    let k_basis = if ROTATED_INDEXER.contains(&arch) {
        Basis::Rotated(k_rotation_group(head))
    } else {
        Basis::AsComputed
    };
    let layers: Vec<bool> = match arch {
        "deepseek32" => (0..n_layer).map(|il| il < trunk).collect(),
        "glm-dsa" => {
            let ctx = int(get("context_length").as_ref()).unwrap_or(0);
            let t = types.unwrap_or_else(|| {
                (0..n_layer)
                    .map(|il| ctx < 1_048_576 || glm52_default(il))
                    .collect()
            });
            (0..n_layer).map(|il| il < trunk && t[il]).collect()
        }
        "hy_v4" => {
            if int(get("attention.indexer.top_k").as_ref()).unwrap_or(0) <= 0 {
                return None;
            }
            types.unwrap_or_else(|| vec![false; n_layer])
        }
        "minimax-m3" => {
            let lead = int(get("leading_dense_block_count").as_ref())
                .unwrap_or(0)
                .max(0) as usize;
            (0..n_layer).map(|il| il >= lead).collect()
        }
        _ => return None,
    };
    let head_dim_v = (arch == "minimax-m3").then_some(head_dim_v);
    Some(Indexer {
        layers,
        head_dim_k: head,
        head_dim_v,
        k_basis,
    })
}

/// The first model layer with no cache of its own (`n_layer - attention.shared_kv_layers`: the
/// later layers read an earlier layer's K and V); None: every layer has its own.
pub fn kv_layers(arch: &str, get: &dyn Fn(&str) -> Option<Value>, n_layer: usize) -> Option<usize> {
    if !matches!(arch, "gemma4" | "gemma3n") {
        return None;
    }
    let shared = int(get("attention.shared_kv_layers").as_ref())
        .unwrap_or(0)
        .max(0) as usize;
    (shared > 0 && shared < n_layer).then(|| n_layer - shared)
}

/// The [K, V] head sizes of the sliding-window layers where the model gives its own
/// (`attention.key_length_swa`, `value_length_swa`: Gemma 4); None: the model's head sizes.
pub fn swa_head_dims(get: &dyn Fn(&str) -> Option<Value>, k: u64, v: u64) -> Option<[u64; 2]> {
    let ks = int(get("attention.key_length_swa").as_ref()).filter(|x| *x > 0)? as u64;
    let vs = int(get("attention.value_length_swa").as_ref())
        .filter(|x| *x > 0)
        .map_or(ks, |x| x as u64);
    ([ks, vs] != [k, v]).then_some([ks, vs])
}

/// Why a state of `arch`'s memory cannot be read yet (None: kvfast reads it), in words that name
/// the memory.
pub fn unread(arch: &str) -> Option<&'static str> {
    match arch {
        "deepseek4" => Some(
            "DeepSeek V4's memory (the DSV4 container: sliding-window caches, compressed K blocks, \
             compressor states)",
        ),
        "dots3note" => Some("dots3note's memory (a DSA pair then a sliding-window cache)"),
        "glm5-next" | "qwen4exp" => Some(
            "a hybrid memory with an indexer (attention cache, recurrent part, then an indexer \
             cache)",
        ),
        _ => None,
    }
}

/// The memory `arch`'s states hold, in a few words, where it is one of the memories of 2026 that
/// need the model to be read (None: another).
pub fn family(arch: &str) -> Option<&'static str> {
    if DSA.contains(&arch) {
        return Some("a DSA memory: an MLA cache, then the lightning indexer's cache");
    }
    match arch {
        "minimax-m3" => Some("an MSA memory: the main cache, then the indexer's cache"),
        "gemma4" | "gemma3n" => {
            Some("caches of the layers with their own K and V (shared-KV layers)")
        }
        _ => None,
    }
}

/// A model's part of a memory: its role, model layers, head sizes ([K, V]; V None: K only) and
/// K basis, as [`crate::open::Opened`] decides them for each cache of a state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub role: Role,
    pub model_layers: Vec<i32>,
    pub head_dims: [Option<u64>; 2],
    pub k_basis: Basis,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_groups_are_llama_cpps() {
        assert_eq!(k_rotation_group(128), 128);
        assert_eq!(k_rotation_group(576), 64);
        assert_eq!(k_rotation_group(192), 64);
        assert_eq!(k_rotation_group(256), 256);
        assert_eq!(k_rotation_group(32), 0);
    }

    #[test]
    fn indexer_layers_by_arch() {
        let kv = |pairs: Vec<(&'static str, Value)>| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        };
        let ds = kv(vec![("attention.indexer.key_length", Value::Int(128))]);
        let i = indexer("deepseek32", &ds, 3, 2, 512).unwrap();
        assert_eq!(i.layers, vec![true, true, false]);
        assert_eq!((i.head_dim_v, i.k_basis), (None, Basis::Rotated(128)));
        let glm = kv(vec![
            ("attention.indexer.key_length", Value::Int(128)),
            ("context_length", Value::Int(2_000_000)),
        ]);
        let i = indexer("glm-dsa", &glm, 8, 8, 512).unwrap();
        assert_eq!(
            i.layers,
            vec![true, true, true, false, false, false, true, false]
        );
        let mm = kv(vec![
            ("attention.indexer.key_length", Value::Int(128)),
            ("leading_dense_block_count", Value::Int(1)),
        ]);
        let i = indexer("minimax-m3", &mm, 3, 3, 64).unwrap();
        assert_eq!(i.layers, vec![false, true, true]);
        assert_eq!((i.head_dim_v, i.k_basis), (Some(64), Basis::AsComputed));
        let hy = kv(vec![("attention.indexer.key_length", Value::Int(128))]);
        assert!(indexer("hy_v4", &hy, 3, 3, 64).is_none()); // top_k 0: no indexer
        assert!(indexer("qwen3", &ds, 3, 3, 64).is_none());
    }
}
