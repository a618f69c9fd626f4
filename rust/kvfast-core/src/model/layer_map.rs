//! The model's own index of every cache layer (the `model_layer` column): from the model's
//! description where it is given, from the bytes alone where they tell.
//!
//! One attention cache holds every attention layer; an iSWA state holds the full-attention layers'
//! cache, then the sliding-window layers' cache; the recurrent part (last) holds the layers with R
//! and S records. A state written with `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY` lacks what can be
//! recomputed: an iSWA model's full-attention cache, a hybrid's attention cache (a hybrid iSWA
//! model keeps its sliding-window one); the map says which model layers are absent
//! ([`Partial`]). A cache with no cell (an empty sequence) writes no layer count and fits any.

use crate::format::layout::{Cache, Layout, Memory};
use crate::model::memory::Role;

/// What a model's metadata says about its layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelLayers {
    /// general.architecture, for messages.
    pub arch: String,
    /// block_count.
    pub n_layer: usize,
    /// Per layer, whether the attention caches hold it (None: every layer).
    pub attention: Option<Vec<bool>>,
    /// Per layer, whether it attends through the sliding window (missing entries: no).
    pub swa: Vec<bool>,
    /// Per layer, whether the recurrent part holds its R and S records (None: not known).
    pub recurrent: Option<Vec<bool>>,
    /// The layers of the sparse attention's indexer cache, written after the attention caches
    /// whatever the flags (DSA, MSA); None: the memory has none.
    pub indexer: Option<Vec<i32>>,
}

/// A cache's role and the model layer of each of its layers.
pub type RolePart = (Role, Vec<i32>);

/// Per cache (the recurrent part last), the model layer of each cache layer; None where neither
/// the model nor the bytes tell.
pub type LayerMap = Vec<Option<Vec<i32>>>;

/// A model whose layers do not fit the state's caches.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    #[error(
        "the model ({arch}) has {attention} attention layers ({window} sliding-window{}) of {n_layer}, \
         the state's caches have {caches:?} layers",
        indexer.map(|n| format!(", an indexer cache of {n}")).unwrap_or_default()
    )]
    Attention {
        arch: String,
        attention: usize,
        window: usize,
        n_layer: usize,
        caches: Vec<usize>,
        /// Layers of the indexer cache the model's memory writes after them.
        indexer: Option<usize>,
    },
    #[error("the model ({arch}) has {model} recurrent layers, the state's recurrent part {state}")]
    Recurrent {
        arch: String,
        model: usize,
        state: usize,
    },
}

fn indices(flags: impl Iterator<Item = bool>) -> Vec<i32> {
    flags
        .enumerate()
        .filter(|(_, f)| *f)
        .map(|(i, _)| i as i32)
        .collect()
}

impl ModelLayers {
    /// The model's layers the attention caches hold, in order.
    pub fn attention_layers(&self) -> Vec<i32> {
        match &self.attention {
            None => (0..self.n_layer as i32).collect(),
            Some(a) => indices(a.iter().take(self.n_layer).copied()),
        }
    }

    fn is_swa(&self, il: i32) -> bool {
        self.swa.get(il as usize).copied().unwrap_or(false)
    }

    /// The model's layers with R and S records, in order (None: not known).
    pub fn recurrent_layers(&self) -> Option<Vec<i32>> {
        self.recurrent
            .as_ref()
            .map(|r| indices(r.iter().take(self.n_layer).copied()))
    }

    /// The model layer of every layer of each attention cache, given each cache's layer count.
    pub fn attention_map(&self, cache_layers: &[usize]) -> Result<Vec<Vec<i32>>, MapError> {
        let held: Vec<Option<usize>> = cache_layers.iter().map(|&n| Some(n)).collect();
        let hybrid = self.recurrent_layers().is_some_and(|r| !r.is_empty());
        Ok(self.attention_fit(&held, hybrid, false)?.0)
    }

    /// The model layer of every layer of each attention cache, and what of the model's attention
    /// caches the state lacks (None: nothing), given each cache's layer count (None: a cache with
    /// no cell, which writes no layer count), whether the state ends with a recurrent part, and
    /// whether its caches are of the builds before mid-2025 (no n_stream field).
    ///
    /// The state says what it holds, the model which layers those are. llama.cpp writes, for a
    /// model whose layers all attend globally, one cache of every attention layer; for a model
    /// with sliding-window layers (an iSWA cache), the full-attention layers' cache, then the
    /// sliding-window layers' one (builds before mid-2025: one cache of every layer). With
    /// `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY` it writes only what cannot be recomputed cheaply: an
    /// iSWA model's sliding-window cache alone, a hybrid's recurrent part alone (no attention
    /// cache; a hybrid iSWA model keeps its sliding-window cache); a plain cache ignores the flag.
    /// The first of these readings whose cache count and layer counts fit is the state's.
    pub fn attention_fit(
        &self,
        held: &[Option<usize>],
        hybrid: bool,
        legacy: bool,
    ) -> Result<(Vec<Vec<i32>>, Option<Partial>), MapError> {
        let (parts, p) = self.attention_parts(held, hybrid, legacy)?;
        Ok((parts.into_iter().map(|(_, l)| l).collect(), p))
    }

    /// [`ModelLayers::attention_fit`] with each cache's role: the full-attention cache (or the
    /// one cache of a model with no window), the sliding-window cache, then the indexer cache of a
    /// sparse attention (DSA, MSA: written whatever the flags, after the others).
    pub fn attention_parts(
        &self,
        held: &[Option<usize>],
        hybrid: bool,
        legacy: bool,
    ) -> Result<(Vec<RolePart>, Option<Partial>), MapError> {
        let layers = self.attention_layers();
        let (window, full): (Vec<i32>, Vec<i32>) =
            layers.iter().copied().partition(|&il| self.is_swa(il));
        fn push<'b>(
            mut want: Vec<(Role, &'b Vec<i32>)>,
            i: Option<&'b Vec<i32>>,
        ) -> Vec<(Role, &'b Vec<i32>)> {
            if let Some(i) = i {
                want.push((Role::Indexer, i));
            }
            want
        }
        let idx = self.indexer.as_ref();
        let with_indexer = |want| push(want, idx);
        let fits = |want: &[(Role, &Vec<i32>)]| {
            held.len() == want.len()
                && held
                    .iter()
                    .zip(want)
                    .all(|(n, w)| n.is_none_or(|n| n == w.1.len()))
        };
        let owned = |m: &[(Role, &Vec<i32>)]| m.iter().map(|(r, v)| (*r, (*v).clone())).collect();
        type Reading<'a> = (
            Vec<(Role, &'a Vec<i32>)>,
            Option<(&'static str, &'a Vec<i32>)>,
        );
        let mut readings: Vec<Reading> = Vec::new();
        if window.is_empty() {
            readings.push((with_indexer(vec![(Role::Attention, &layers)]), None));
            if hybrid && !layers.is_empty() {
                readings.push((with_indexer(vec![]), Some(("attention cache", &layers))));
            }
        } else {
            let one = (with_indexer(vec![(Role::Attention, &layers)]), None);
            if legacy {
                readings.push(one.clone());
            }
            readings.push((
                with_indexer(vec![
                    (Role::Attention, &full),
                    (Role::SlidingWindow, &window),
                ]),
                None,
            ));
            readings.push((
                with_indexer(vec![(Role::SlidingWindow, &window)]),
                Some(("full-attention cache", &full)),
            ));
            if !legacy {
                readings.push(one);
            }
        }
        if layers.is_empty() {
            readings.push((vec![], None));
        }
        for (want, gone) in &readings {
            if fits(want) {
                let p = gone.map(|(absent, g)| Partial {
                    absent,
                    model_layers: g.clone(),
                });
                return Ok((owned(want), p));
            }
        }
        Err(MapError::Attention {
            arch: self.arch.clone(),
            attention: layers.len(),
            window: window.len(),
            n_layer: self.n_layer,
            caches: held.iter().map(|n| n.unwrap_or(0)).collect(),
            indexer: self.indexer.as_ref().map(Vec::len),
        })
    }
}

/// What a state written with `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY` lacks of its model's memory
/// (llama-server's context checkpoints of hybrid and sliding-window models).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partial {
    /// The cache the state lacks: "attention cache" (a hybrid's: the state is its recurrent part,
    /// or a hybrid iSWA model's sliding-window cache then recurrent part) or "full-attention
    /// cache" (an iSWA model's: the state is its sliding-window cache).
    pub absent: &'static str,
    /// The model layers whose K and V that cache holds (none of them has a record in the state).
    pub model_layers: Vec<i32>,
}

/// A state's layer map, and what of its model's memory it lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fit {
    pub map: LayerMap,
    /// Per cache (the recurrent part last), its role (None: not known without the model).
    pub roles: Vec<Option<Role>>,
    /// Some: a partial state (PARTIAL_ONLY); None: the whole memory, or not known (no model).
    pub partial: Option<Partial>,
}

/// A cache's layer count: its longest stream's.
pub fn cache_layers(cache: &Cache) -> usize {
    cache
        .streams
        .iter()
        .map(|s| s.layers.len())
        .max()
        .unwrap_or(0)
}

/// A cache's layer count as the bytes give it: None for a cache with no cell in any stream (it
/// writes its cell counts and nothing else: no layer count), else its longest stream's.
pub fn held_layers(cache: &Cache) -> Option<usize> {
    (cache.cells() > 0).then(|| cache_layers(cache))
}

/// The layer map of a walked state: the model's where given (checked against the caches), else
/// what the bytes alone tell: one attention cache and nothing else holds every layer; a recurrent
/// part with records for each of the layers it counts holds every layer (a recurrent model), and
/// then one attention cache of as many layers does too (Falcon-H1). A hybrid's attention caches
/// are the model's to map.
pub fn layer_map(layout: &Layout, model: Option<&ModelLayers>) -> Result<LayerMap, MapError> {
    Ok(fit(layout, model)?.map)
}

/// [`layer_map`], and (with the model) what of the model's memory the state lacks: see
/// [`ModelLayers::attention_fit`]. A cache with no cell fits any layer count (an empty sequence
/// writes no layer count), so an empty sequence's state maps as its model's.
pub fn fit(layout: &Layout, model: Option<&ModelLayers>) -> Result<Fit, MapError> {
    let attention: Vec<usize> = layout.attention().map(cache_layers).collect();
    let held: Vec<Option<usize>> = layout.attention().map(held_layers).collect();
    let legacy = layout.attention().any(|c| !c.has_n_stream);
    let recurrent = layout.recurrent().map(|(_, c)| {
        let n_field = match c.memory {
            Memory::Recurrent { n_layer } => n_layer as usize,
            Memory::Attention => 0,
        };
        (n_field, cache_layers(c))
    });
    let mut partial = None;
    let mut roles: Vec<Option<Role>> = vec![None; attention.len()];
    let (att, rec): (Vec<Option<Vec<i32>>>, Option<Vec<i32>>) = match model {
        Some(m) => {
            let (parts, p) = m.attention_parts(&held, recurrent.is_some(), legacy)?;
            partial = p;
            roles = parts.iter().map(|(r, _)| Some(*r)).collect();
            let att: Vec<Vec<i32>> = parts.into_iter().map(|(_, l)| l).collect();
            let rec_layers = m.recurrent_layers();
            if let (Some((_, have)), Some(r)) = (recurrent, &rec_layers) {
                if r.len() != have {
                    return Err(MapError::Recurrent {
                        arch: m.arch.clone(),
                        model: r.len(),
                        state: have,
                    });
                }
            }
            (att.into_iter().map(Some).collect(), rec_layers)
        }
        None => match recurrent {
            None if attention.len() == 1 => (vec![Some((0..attention[0] as i32).collect())], None),
            None => (vec![None; attention.len()], None),
            Some((n, have)) if n != have => (vec![None; attention.len()], None),
            Some((n, _)) => {
                let every: Vec<i32> = (0..n as i32).collect();
                let att = if attention == [n] {
                    vec![Some(every.clone())]
                } else {
                    vec![None; attention.len()]
                };
                (att, Some(every))
            }
        },
    };
    if model.is_none() && attention.len() == 1 {
        roles[0] = Some(Role::Attention);
    }
    let mut map = att;
    if recurrent.is_some() {
        map.push(rec);
        roles.push(Some(Role::Recurrent));
    }
    Ok(Fit {
        map,
        roles,
        partial,
    })
}

/// The model layer of `layer` of cache `cache` in `map` (None: not known).
pub fn model_layer(map: &[Option<Vec<i32>>], cache: u32, layer: u32) -> Option<i32> {
    map.get(cache as usize)?
        .as_ref()?
        .get(layer as usize)
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{layout, stream};

    fn model(n_layer: usize, swa: &[usize], attention: Option<&[usize]>) -> ModelLayers {
        let flags = |on: &[usize]| (0..n_layer).map(|i| on.contains(&i)).collect::<Vec<_>>();
        ModelLayers {
            arch: "test".into(),
            n_layer,
            attention: attention.map(flags),
            swa: flags(swa),
            recurrent: None,
            indexer: None,
        }
    }

    fn caches(layers: &[usize]) -> Layout {
        layout(
            layers
                .iter()
                .map(|&n| vec![stream(0, &[0], &[&[0]], &vec![(8, Some(8)); n])])
                .collect(),
        )
    }

    #[test]
    fn one_cache_alone_holds_every_layer() {
        assert_eq!(
            layer_map(&caches(&[3]), None).unwrap(),
            vec![Some(vec![0, 1, 2])]
        );
        // two caches without a model: not known
        assert_eq!(layer_map(&caches(&[1, 2]), None).unwrap(), vec![None, None]);
    }

    #[test]
    fn iswa_full_then_window_or_window_alone() {
        let m = model(6, &[0, 1, 3, 4], None);
        assert_eq!(
            layer_map(&caches(&[2, 4]), Some(&m)).unwrap(),
            vec![Some(vec![2, 5]), Some(vec![0, 1, 3, 4])]
        );
        assert_eq!(m.attention_map(&[4]).unwrap(), vec![vec![0, 1, 3, 4]]);
        assert_eq!(
            m.attention_map(&[6]).unwrap(),
            vec![(0..6).collect::<Vec<_>>()]
        );
        let err = m.attention_map(&[3]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the model (test) has 6 attention layers (4 sliding-window) of 6, the state's caches have [3] layers"
        );
    }

    #[test]
    fn a_cache_of_no_cell_fits_the_models_layers() {
        // no cell: no n_layer in the bytes (every attention cell dropped, a 0-cell state)
        let empty = || vec![stream(0, &[], &[], &[])];
        let plain = model(2, &[], None);
        assert_eq!(
            layer_map(&layout(vec![empty()]), Some(&plain)).unwrap(),
            vec![Some(vec![0, 1])]
        );
        // an iSWA pair with its sliding-window cache emptied: the full cache's layers still fit
        let iswa = model(6, &[0, 1, 3, 4], None);
        let full = vec![stream(0, &[0], &[&[0]], &[(8, Some(8)); 2])];
        assert_eq!(
            layer_map(&layout(vec![full, empty()]), Some(&iswa)).unwrap(),
            vec![Some(vec![2, 5]), Some(vec![0, 1, 3, 4])]
        );
        // a cache that holds cells and says 0 layers still has to fit
        let zero = vec![stream(0, &[0], &[&[0]], &[])];
        assert!(layer_map(&layout(vec![zero]), Some(&plain)).is_err());
    }

    #[test]
    fn hybrid_attention_layers_only() {
        let m = model(5, &[], Some(&[1, 4]));
        assert_eq!(m.attention_map(&[2]).unwrap(), vec![vec![1, 4]]);
        assert!(m.attention_map(&[]).unwrap_err().to_string().contains("[]"));
        let none = model(3, &[], Some(&[]));
        assert_eq!(none.attention_map(&[]).unwrap(), Vec::<Vec<i32>>::new());
    }

    /// A hybrid: the layers not in `attention` are recurrent.
    fn model_rec(n_layer: usize, swa: &[usize], attention: &[usize]) -> ModelLayers {
        ModelLayers {
            recurrent: Some((0..n_layer).map(|i| !attention.contains(&i)).collect()),
            ..model(n_layer, swa, Some(attention))
        }
    }

    #[test]
    fn partial_states_lack_a_cache_the_model_has() {
        // a hybrid (LFM2): attention at 2 and 4; PARTIAL_ONLY writes the recurrent part alone
        let m = model_rec(5, &[], &[2, 4]);
        let (map, p) = m.attention_fit(&[], true, false).unwrap();
        assert!(map.is_empty());
        let p = p.unwrap();
        assert_eq!((p.absent, p.model_layers), ("attention cache", vec![2, 4]));
        // the whole memory: nothing absent; without the recurrent part, no cache is an error
        assert_eq!(m.attention_fit(&[Some(2)], true, false).unwrap().1, None);
        assert!(m.attention_fit(&[], false, false).is_err());
        // an iSWA model (Gemma 3: layers 0 and 2 slide): the sliding-window cache alone
        let g = model(4, &[0, 2], None);
        let (map, p) = g.attention_fit(&[Some(2)], false, false).unwrap();
        assert_eq!(map, vec![vec![0, 2]]);
        assert_eq!(p.unwrap().model_layers, vec![1, 3]);
        // before mid-2025 one cache held every layer of an iSWA model
        let (map, p) = g.attention_fit(&[None], false, true).unwrap();
        assert_eq!((map, p), (vec![vec![0, 1, 2, 3]], None));
        // a hybrid iSWA model (LFM2 with a window): the full-attention cache (no layer) is absent
        let s = model_rec(5, &[2, 4], &[2, 4]);
        let (map, p) = s.attention_fit(&[Some(0), Some(2)], true, false).unwrap();
        assert_eq!((map, p), (vec![vec![], vec![2, 4]], None));
        let (map, p) = s.attention_fit(&[Some(2)], true, false).unwrap();
        assert_eq!(map, vec![vec![2, 4]]);
        assert_eq!(p.unwrap().absent, "full-attention cache");
    }

    #[test]
    fn a_cache_with_no_cell_fits_any_layer_count() {
        // an empty sequence writes its caches' cell counts (0) and no layer count
        let m = model_rec(5, &[], &[2, 4]);
        let (map, p) = m.attention_fit(&[None], true, false).unwrap();
        assert_eq!((map, p), (vec![vec![2, 4]], None));
        let g = model(4, &[0, 2], None);
        assert_eq!(
            g.attention_fit(&[None, None], false, false).unwrap().0,
            vec![vec![1, 3], vec![0, 2]]
        );
        // one empty cache of an iSWA model: its sliding-window cache (PARTIAL_ONLY)
        let (map, p) = g.attention_fit(&[None], false, false).unwrap();
        assert_eq!(map, vec![vec![0, 2]]);
        assert!(p.is_some());
        // the count of caches still has to fit
        assert!(g.attention_fit(&[None, None, None], false, false).is_err());
        let plain = model(2, &[], None);
        assert!(plain.attention_fit(&[None, None], false, false).is_err());
        assert_eq!(
            plain.attention_fit(&[None], false, false).unwrap(),
            (vec![vec![0, 1]], None)
        );
    }

    #[test]
    fn lookup() {
        let map = vec![Some(vec![3, 7]), None];
        assert_eq!(model_layer(&map, 0, 1), Some(7));
        assert_eq!(model_layer(&map, 0, 2), None);
        assert_eq!(model_layer(&map, 1, 0), None);
        assert_eq!(model_layer(&map, 2, 0), None);
    }
}
