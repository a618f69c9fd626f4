//! What a walk of the state bytes finds: containers, caches, streams, cells and records.

use crate::format::types::GgmlType;

/// The four containers llama.cpp writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Container {
    /// `llama_state_seq_get_data` bytes.
    RawSeq,
    /// `llama_state_seq_save_file` / llama-server slot save.
    Ggsq,
    /// `llama_state_save_file` / `--prompt-cache`.
    Ggsn,
    /// `llama_state_get_data` bytes.
    RawState,
}

impl Container {
    pub fn name(self) -> &'static str {
        match self {
            Container::RawSeq => "seq",
            Container::Ggsq => "ggsq",
            Container::Ggsn => "ggsn",
            Container::RawState => "state",
        }
    }
}

/// One K, V, R or S record: a header and the rows of every cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// K or V (an attention cache), R or S (the recurrent part).
    pub kind: Kind,
    pub ty: GgmlType,
    /// Values per cell (n_embd_k_gqa or n_embd_v_gqa; n_embd_r or n_embd_s, 0 for a state the
    /// model does not keep).
    pub n_embd: u64,
    /// Bytes of one cell's row (for a transposed record: el_bytes * n_embd).
    pub row_bytes: u64,
    pub header_offset: u64,
    pub header_len: u64,
    pub data_offset: u64,
    pub data_len: u64,
    /// V stored element-major (flash attention off).
    pub transposed: bool,
}

/// One layer of a stream: its K record and its V record (None in a V-less MLA cache); in the
/// recurrent part, its R record (in `k`) and its S record (in `v`). Each record knows its kind:
/// ask [`Layer::record`] rather than reading the fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    pub k: Record,
    pub v: Option<Record>,
}

impl Layer {
    /// The layer's record of `kind` (None when it has none: no V in a V-less cache, no K or V in
    /// the recurrent part, no R or S in an attention cache).
    pub fn record(&self, kind: Kind) -> Option<&Record> {
        if self.k.kind == kind {
            return Some(&self.k);
        }
        self.v.as_ref().filter(|v| v.kind == kind)
    }
}

/// K or V (attention caches), R or S (the recurrent part: the conv / token-shift state, and the
/// SSM / WKV / delta-net state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    K,
    V,
    R,
    S,
}

impl Kind {
    pub const BOTH: [Kind; 2] = [Kind::K, Kind::V];
    pub const RECURRENT: [Kind; 2] = [Kind::R, Kind::S];
    pub const ALL: [Kind; 4] = [Kind::K, Kind::V, Kind::R, Kind::S];

    /// "k", "v", "r" or "s", as tables and regions name it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::K => "k",
            Kind::V => "v",
            Kind::R => "r",
            Kind::S => "s",
        }
    }

    /// "k", "v", "r" or "s", either case.
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "k" | "K" => Some(Kind::K),
            "v" | "V" => Some(Kind::V),
            "r" | "R" => Some(Kind::R),
            "s" | "S" => Some(Kind::S),
            _ => None,
        }
    }

    /// 0 for K (R), 1 for V (S): the index of per-kind pairs such as [K, V] rotation groups (the
    /// recurrent part is never rotated).
    pub fn index(self) -> usize {
        match self {
            Kind::K | Kind::R => 0,
            Kind::V | Kind::S => 1,
        }
    }

    /// R or S.
    pub fn is_recurrent(self) -> bool {
        matches!(self, Kind::R | Kind::S)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream {
    pub index: u32,
    /// Offset of the cell_count field.
    pub offset: u64,
    pub cell_count: u32,
    pub meta_offset: u64,
    pub meta_len: u64,
    pub pos: Vec<i32>,
    /// CSR offsets into `seq_ids`, `cell_count + 1` long (empty for an empty stream).
    pub seq_start: Vec<u32>,
    pub seq_ids: Vec<i32>,
    /// Cell extensions, `ext_width` values per cell, when the cache keeps them.
    pub ext: Option<Vec<i32>>,
    pub ext_width: usize,
    pub layer_header_offset: u64,
    pub v_trans: bool,
    pub layers: Vec<Layer>,
}

impl Stream {
    /// A stream of `cell_count` cells whose count field is at `offset` and whose cell metadata
    /// start at `meta_offset`, before any cell is read.
    pub fn new(
        index: u32,
        offset: u64,
        cell_count: u32,
        meta_offset: u64,
        ext_width: usize,
    ) -> Self {
        Stream {
            index,
            offset,
            cell_count,
            meta_offset,
            meta_len: 0,
            pos: Vec::new(),
            seq_start: Vec::new(),
            seq_ids: Vec::new(),
            ext: None,
            ext_width,
            layer_header_offset: meta_offset,
            v_trans: false,
            layers: Vec::new(),
        }
    }

    pub fn cell_seqs(&self, cell: usize) -> &[i32] {
        &self.seq_ids[self.seq_start[cell] as usize..self.seq_start[cell + 1] as usize]
    }
}

/// What a cache of the state is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// An attention KV cache (`llama_kv_cache`): K and V records (K only when V-less).
    Attention,
    /// The recurrent part (`llama_memory_recurrent`): one stream of one cell per sequence, R and S
    /// records of the layers that have them; `n_layer` is its field (every layer of the model).
    Recurrent { n_layer: u32 },
}

impl Memory {
    /// "kv" or "recurrent".
    pub fn name(self) -> &'static str {
        match self {
            Memory::Attention => "kv",
            Memory::Recurrent { .. } => "recurrent",
        }
    }

    pub fn is_recurrent(self) -> bool {
        matches!(self, Memory::Recurrent { .. })
    }
}

/// One part of a state's memory: an attention cache (an iSWA model writes two), or the recurrent
/// part (last: a hybrid writes its attention caches, then it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cache {
    pub offset: u64,
    /// Whether the cache starts with a u32 n_stream (builds from mid-2025 on; never the
    /// recurrent part).
    pub has_n_stream: bool,
    pub memory: Memory,
    pub streams: Vec<Stream>,
}

impl Cache {
    /// Cells of every stream.
    pub fn cells(&self) -> u64 {
        self.streams.iter().map(|s| s.cell_count as u64).sum()
    }
}

/// Outputs of a GGSN version 9 (or 2025 raw) whole-context state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outputs {
    pub offset: u64,
    pub output_pos: Vec<i32>,
    pub logits_offset: u64,
    pub n_logits: u64,
    pub embd_offset: u64,
    pub n_embd: u64,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One contiguous region of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    pub offset: u64,
    pub nbytes: u64,
    pub what: &'static str,
    /// "rows", "outputs" (logits, embeddings) or "meta".
    pub role: &'static str,
    pub cache: Option<u32>,
    pub stream: Option<u32>,
    pub kind: Option<&'static str>,
    pub layer: Option<u32>,
    pub ty: Option<GgmlType>,
}

/// Everything a walk found, with no row touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub size: u64,
    pub container: Container,
    pub version: Option<u32>,
    pub seq_id: Option<i32>,
    pub arch: Option<String>,
    /// Token ids (for a llama-server slot file, those of its packed blob).
    pub tokens: Option<Vec<i32>>,
    /// llama-server's packed token blob, when the token array holds one (the raw words stay
    /// readable in the file's "tokens" region).
    pub server_tokens: Option<crate::format::server_tokens::ServerTokens>,
    pub outputs: Option<Outputs>,
    /// Bytes of a cell extension (0, 8 or 12).
    pub ext_bytes: u8,
    /// Short names of what this reading of the bytes relied on.
    pub features: Vec<&'static str>,
    /// Offset of the container's own header regions, in file order, up to the first cache.
    pub prefix: Vec<Region>,
    /// The attention caches in file order, then the recurrent part, if any.
    pub caches: Vec<Cache>,
    /// Written with `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE`: every header and cell, no row (llama.cpp
    /// kept the rows in its own buffers); every record's `data_len` is 0.
    pub rows_on_device: bool,
}

impl Layout {
    /// The sequence a sequence state holds: its header's seq_id, or (GGSQ, raw bytes without the
    /// io magic) the one its cells list (the walk checked they all list one); None for a
    /// whole-context state, or where nothing says (a recurrent part's cells list none).
    pub fn own_seq(&self) -> Option<i32> {
        if !matches!(self.container, Container::RawSeq | Container::Ggsq) {
            return None;
        }
        self.seq_id.or_else(|| {
            self.caches
                .iter()
                .flat_map(|c| &c.streams)
                .find_map(|s| s.seq_ids.first())
                .copied()
        })
    }

    /// The attention caches (every cache but the recurrent part).
    pub fn attention(&self) -> impl Iterator<Item = &Cache> {
        self.caches.iter().filter(|c| !c.memory.is_recurrent())
    }

    /// The recurrent part, with its index among the caches.
    pub fn recurrent(&self) -> Option<(usize, &Cache)> {
        self.caches
            .iter()
            .enumerate()
            .find(|(_, c)| c.memory.is_recurrent())
    }

    /// Every region of the file in file order; they tile the file exactly.
    pub fn regions(&self) -> Vec<Region> {
        let mut out = self.prefix.clone();
        for (ci, cache) in self.caches.iter().enumerate() {
            let ci = ci as u32;
            let base = Region {
                offset: 0,
                nbytes: 0,
                what: "",
                role: "meta",
                cache: Some(ci),
                stream: None,
                kind: None,
                layer: None,
                ty: None,
            };
            if cache.has_n_stream {
                out.push(Region {
                    offset: cache.offset,
                    nbytes: 4,
                    what: "cache header",
                    ..base.clone()
                });
            }
            for s in &cache.streams {
                let sb = Region {
                    stream: Some(s.index),
                    ..base.clone()
                };
                let recurrent = cache.memory.is_recurrent();
                out.push(Region {
                    offset: s.offset,
                    nbytes: 4,
                    what: if recurrent {
                        "recurrent header"
                    } else {
                        "stream header"
                    },
                    ..sb.clone()
                });
                // an empty stream ends at its cell count; the recurrent part never does
                if s.cell_count == 0 && !recurrent {
                    continue;
                }
                if s.meta_len > 0 {
                    out.push(Region {
                        offset: s.meta_offset,
                        nbytes: s.meta_len,
                        what: "cell meta",
                        ..sb.clone()
                    });
                }
                out.push(Region {
                    offset: s.layer_header_offset,
                    nbytes: 8,
                    what: "layer header",
                    ..sb.clone()
                });
                let kinds = if recurrent {
                    Kind::RECURRENT
                } else {
                    Kind::BOTH
                };
                for kind in kinds {
                    for (li, layer) in s.layers.iter().enumerate() {
                        let Some(rec) = layer.record(kind) else {
                            continue;
                        };
                        let rb = Region {
                            kind: Some(kind.name()),
                            layer: Some(li as u32),
                            ty: Some(rec.ty),
                            ..sb.clone()
                        };
                        let (hw, rw) = match kind {
                            Kind::K => ("k header", "k rows"),
                            Kind::V => ("v header", "v rows"),
                            Kind::R => ("r header", "r rows"),
                            Kind::S => ("s header", "s rows"),
                        };
                        out.push(Region {
                            offset: rec.header_offset,
                            nbytes: rec.header_len,
                            what: hw,
                            ..rb.clone()
                        });
                        out.push(Region {
                            offset: rec.data_offset,
                            nbytes: rec.data_len,
                            what: rw,
                            role: "rows",
                            ..rb
                        });
                    }
                }
            }
        }
        out
    }

    /// (row bytes, output bytes, metadata bytes).
    pub fn byte_totals(&self) -> (u64, u64, u64) {
        let mut t = (0, 0, 0);
        for r in self.regions() {
            match r.role {
                "rows" => t.0 += r.nbytes,
                "outputs" => t.1 += r.nbytes,
                _ => t.2 += r.nbytes,
            }
        }
        t
    }
}
