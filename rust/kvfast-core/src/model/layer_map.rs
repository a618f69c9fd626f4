//! The model's own index of every cache layer (the `model_layer` column): from the model's
//! description where it is given, from the bytes alone where they tell.
//!
//! One attention cache holds every attention layer; an iSWA state holds the full-attention layers'
//! cache, then the sliding-window layers' cache (or that one alone when written with
//! PARTIAL_ONLY); the recurrent part (last) holds the layers with R and S records.

use crate::format::layout::{Cache, Layout, Memory};

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
}

/// Per cache (the recurrent part last), the model layer of each cache layer; None where neither
/// the model nor the bytes tell.
pub type LayerMap = Vec<Option<Vec<i32>>>;

/// A model whose layers do not fit the state's caches.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    #[error(
        "the model ({arch}) has {attention} attention layers ({window} sliding-window) of {n_layer}, \
         the state's caches have {caches:?} layers"
    )]
    Attention {
        arch: String,
        attention: usize,
        window: usize,
        n_layer: usize,
        caches: Vec<usize>,
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
        let known: Vec<Option<usize>> = cache_layers.iter().map(|&n| Some(n)).collect();
        self.attention_map_of(&known)
    }

    /// [`Self::attention_map`], where a cache's layer count may be unknown (None: a cache holding
    /// no cell writes no n_layer), and then fits any.
    pub fn attention_map_of(
        &self,
        cache_layers: &[Option<usize>],
    ) -> Result<Vec<Vec<i32>>, MapError> {
        let layers = self.attention_layers();
        let (window, full): (Vec<i32>, Vec<i32>) =
            layers.iter().copied().partition(|&il| self.is_swa(il));
        let fits = |want: &[&Vec<i32>]| {
            cache_layers.len() == want.len()
                && cache_layers
                    .iter()
                    .zip(want)
                    .all(|(n, w)| n.is_none_or(|n| n == w.len()))
        };
        if fits(&[&layers]) {
            return Ok(vec![layers]);
        }
        if !window.is_empty() && fits(&[&full, &window]) {
            return Ok(vec![full, window]);
        }
        if !window.is_empty() && fits(&[&window]) {
            return Ok(vec![window]);
        }
        if layers.is_empty() && cache_layers.is_empty() {
            return Ok(vec![]);
        }
        Err(MapError::Attention {
            arch: self.arch.clone(),
            attention: layers.len(),
            window: window.len(),
            n_layer: self.n_layer,
            caches: cache_layers.iter().map(|n| n.unwrap_or(0)).collect(),
        })
    }
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

/// The layer map of a walked state: the model's where given (checked against the caches), else
/// what the bytes alone tell: one attention cache and nothing else holds every layer; a recurrent
/// part with records for each of the layers it counts holds every layer (a recurrent model), and
/// then one attention cache of as many layers does too (Falcon-H1). A hybrid's attention caches
/// are the model's to map.
pub fn layer_map(layout: &Layout, model: Option<&ModelLayers>) -> Result<LayerMap, MapError> {
    let attention: Vec<usize> = layout.attention().map(cache_layers).collect();
    // a cache of no cell says no layer count: any of the model's fits it
    let known: Vec<Option<usize>> = layout
        .attention()
        .map(|c| {
            c.streams
                .iter()
                .any(|s| s.cell_count > 0)
                .then(|| cache_layers(c))
        })
        .collect();
    let recurrent = layout.recurrent().map(|(_, c)| {
        let n_field = match c.memory {
            Memory::Recurrent { n_layer } => n_layer as usize,
            Memory::Attention => 0,
        };
        (n_field, cache_layers(c))
    });
    let (att, rec): (Vec<Option<Vec<i32>>>, Option<Vec<i32>>) = match model {
        Some(m) => {
            let att = m.attention_map_of(&known)?;
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
    let mut map = att;
    if recurrent.is_some() {
        map.push(rec);
    }
    Ok(map)
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

    #[test]
    fn lookup() {
        let map = vec![Some(vec![3, 7]), None];
        assert_eq!(model_layer(&map, 0, 1), Some(7));
        assert_eq!(model_layer(&map, 0, 2), None);
        assert_eq!(model_layer(&map, 1, 0), None);
        assert_eq!(model_layer(&map, 2, 0), None);
    }
}
