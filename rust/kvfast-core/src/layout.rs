//! What a walk of the state bytes finds: containers, caches, streams, cells and records.

use crate::types::GgmlType;

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

/// One K or V record: a header and the rows of every cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub ty: GgmlType,
    /// Values per cell (n_embd_k_gqa or n_embd_v_gqa).
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    pub k: Record,
    pub v: Option<Record>,
}

impl Layer {
    /// The layer's K record, or its V record (None when the model has no V).
    pub fn record(&self, kind: Kind) -> Option<&Record> {
        match kind {
            Kind::K => Some(&self.k),
            Kind::V => self.v.as_ref(),
        }
    }
}

/// K or V.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    K,
    V,
}

impl Kind {
    pub const BOTH: [Kind; 2] = [Kind::K, Kind::V];

    /// "k" or "v", as tables and regions name it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::K => "k",
            Kind::V => "v",
        }
    }

    /// "k", "K", "v" or "V".
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "k" | "K" => Some(Kind::K),
            "v" | "V" => Some(Kind::V),
            _ => None,
        }
    }

    /// 0 for K, 1 for V: the index of per-kind pairs such as [K, V] rotation groups.
    pub fn index(self) -> usize {
        match self {
            Kind::K => 0,
            Kind::V => 1,
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
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
    pub fn cell_seqs(&self, cell: usize) -> &[i32] {
        &self.seq_ids[self.seq_start[cell] as usize..self.seq_start[cell + 1] as usize]
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cache {
    pub offset: u64,
    /// Whether the cache starts with a u32 n_stream (builds from mid-2025 on).
    pub has_n_stream: bool,
    pub streams: Vec<Stream>,
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
    pub server_tokens: Option<crate::server_tokens::ServerTokens>,
    pub outputs: Option<Outputs>,
    /// Bytes of a cell extension (0, 8 or 12).
    pub ext_bytes: u8,
    /// Short names of what this reading of the bytes relied on.
    pub features: Vec<&'static str>,
    /// Offset of the container's own header regions, in file order, up to the first cache.
    pub prefix: Vec<Region>,
    pub caches: Vec<Cache>,
}

impl Layout {
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
                out.push(Region {
                    offset: s.offset,
                    nbytes: 4,
                    what: "stream header",
                    ..sb.clone()
                });
                if s.cell_count == 0 {
                    continue;
                }
                out.push(Region {
                    offset: s.meta_offset,
                    nbytes: s.meta_len,
                    what: "cell meta",
                    ..sb.clone()
                });
                out.push(Region {
                    offset: s.layer_header_offset,
                    nbytes: 8,
                    what: "layer header",
                    ..sb.clone()
                });
                for kind in ["k", "v"] {
                    for (li, layer) in s.layers.iter().enumerate() {
                        let rec = if kind == "k" {
                            Some(&layer.k)
                        } else {
                            layer.v.as_ref()
                        };
                        let Some(rec) = rec else { continue };
                        let rb = Region {
                            kind: Some(kind),
                            layer: Some(li as u32),
                            ty: Some(rec.ty),
                            ..sb.clone()
                        };
                        let (hw, rw) = if kind == "k" {
                            ("k header", "k rows")
                        } else {
                            ("v header", "v rows")
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
