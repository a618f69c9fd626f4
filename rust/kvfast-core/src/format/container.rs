//! Telling the containers apart and walking a whole state (section 1 of the format doc).

use crate::error::{Error, Result};
use crate::format::cache::{furthest, parse_memory, Reading, MAX_SEQ};
use crate::format::cursor::{Bytes, Cursor};
use crate::format::guarantees::check;
use crate::format::layout::{Cache, Container, Layout, Memory, Outputs, Region};
use crate::format::recurrent::RecurrentHint;
use crate::format::server_tokens::{unpack, ServerTokens};

pub const GGSQ_MAGIC: u32 = 0x6767_7371;
pub const GGSN_MAGIC: u32 = 0x6767_736E;
pub const IO_MAGIC: u32 = 0xAF14_3CD8;
const GGUF_MAGIC: u32 = 0x4655_4747;
/// The first word of DeepSeek V4's memory (`llama_kv_cache_dsv4`: "DSV4"), where a KV cache's
/// n_stream would be.
pub const DSV4_MAGIC: u32 = 0x3456_5344;
/// The longest architecture name a whole state may start with (llama.cpp's names are far shorter).
pub const MAX_ARCH_LEN: u32 = 64;

/// Whether `name` is an architecture name a whole state may start with: 1 to [`MAX_ARCH_LEN`]
/// bytes of `[A-Za-z0-9_.-]` (what the reader accepts, and so what the writer writes).
pub fn is_arch_name(name: &[u8]) -> bool {
    (1..=MAX_ARCH_LEN as usize).contains(&name.len())
        && name
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || b"_-.".contains(c))
}

/// Options a caller may give the walk: what the model says where the bytes cannot tell.
#[derive(Debug, Clone, Copy, Default)]
pub struct WalkOptions {
    /// Whether cells carry an extension; None: infer it from the bytes.
    pub cell_ext: Option<bool>,
    /// Whether the attention caches hold K records only (a V-less MLA cache: `key_length_mla` in
    /// the model). None: caches with V; a state that reads only as V-less is refused as
    /// ambiguous (it is also a state cut before its V records), naming the model as the way out.
    pub v_less: Option<bool>,
    /// The model's recurrent layers (`layers` 0: no recurrent part). None: a recurrent part is
    /// read where the bytes hold one (its R and S records counted), or where the state's arch is
    /// one llama.cpp gives a recurrent memory.
    pub recurrent: Option<RecurrentHint>,
}

/// The part of a state before its first KV cache.
#[derive(Clone)]
struct Prefix {
    container: Container,
    version: Option<u32>,
    seq_id: Option<i32>,
    arch: Option<String>,
    tokens: Option<Vec<i32>>,
    server_tokens: Option<ServerTokens>,
    outputs: Option<Outputs>,
    regions: Vec<Region>,
    features: Vec<&'static str>,
    memory: usize,
}

fn region(offset: usize, nbytes: usize, what: &'static str, role: &'static str) -> Region {
    Region {
        offset: offset as u64,
        nbytes: nbytes as u64,
        what,
        role,
        cache: None,
        stream: None,
        kind: None,
        layer: None,
        ty: None,
    }
}

/// Walk the whole state in `buf`: containers, caches, cells, records; no row is read.
pub fn walk(buf: &[u8], opts: WalkOptions) -> Result<Layout> {
    walk_bytes(Bytes::whole(buf), opts)
}

/// [`walk`] over `buf`, sparse ones too: over the sparse bytes of a remote state, a walk whose
/// probe recorded a miss read past what was fetched, and its result (layout or error) means
/// nothing until those bytes are fetched and it is walked again (see [`crate::source::sparse`]).
pub fn walk_bytes(buf: Bytes, opts: WalkOptions) -> Result<Layout> {
    let mut cur = Cursor::at(buf, 0);
    let magic = cur.u32("magic or first field")?;
    // (prefix parser, readings allowed) candidates; each one is tried in full.
    let mut candidates: Vec<(Prefix, Vec<Reading>)> = Vec::new();
    let new = Reading::kv(true, 12);
    let old = [Reading::kv(true, 8), Reading::kv(false, 8)];
    match magic {
        GGSQ_MAGIC | GGSN_MAGIC => {
            let ggsq = magic == GGSQ_MAGIC;
            let (name, supported) = if ggsq {
                ("GGSQ", "2 and 3")
            } else {
                ("GGSN", "9 and 10")
            };
            let version = cur.u32("version")?;
            let modern = match (ggsq, version) {
                (true, 3) | (false, 10) => true,
                (true, 2) | (false, 9) => false,
                _ => {
                    return Err(Error::UnsupportedVersion {
                        container: name,
                        offset: 4,
                        version,
                        supported,
                    })
                }
            };
            let n_off = cur.pos();
            let n_token = cur.u32("n_token")?;
            let tokens = cur.i32_array(n_token as u64, &format!("tokens ({n_token} token ids)"))?;
            let mut regions = vec![region(0, n_off + 4, "container header", "meta")];
            regions.push(region(n_off + 4, tokens.len() * 4, "tokens", "meta"));
            let server_tokens = unpack(&tokens, n_off + 4)?;
            let mut features = vec![];
            if server_tokens.is_some() {
                features.push("server token blob v1");
            }
            let p = Prefix {
                container: if ggsq {
                    Container::Ggsq
                } else {
                    Container::Ggsn
                },
                version: Some(version),
                seq_id: None,
                arch: None,
                tokens: Some(match &server_tokens {
                    Some(st) => st.tokens.clone(),
                    None => tokens,
                }),
                server_tokens,
                outputs: None,
                regions,
                features,
                memory: cur.pos(),
            };
            if ggsq {
                candidates.push((p, if modern { vec![new] } else { old.to_vec() }));
            } else if modern {
                candidates.push((state_prefix(cur, p, false)?, vec![new]));
            } else {
                // GGSN 9: with the outputs block (to February 2026), or without it (from then on,
                // with no version bump); both are tried, and exactly one must consume the bytes.
                let mut prior = None;
                for (with_outputs, readings) in [(true, old.to_vec()), (false, vec![old[0]])] {
                    match state_prefix(cur, p.clone(), with_outputs) {
                        Ok(p) => candidates.push((p, readings)),
                        Err(e) => prior = Some(furthest(prior, e)),
                    }
                }
                return choose(buf, candidates, opts, prior);
            }
        }
        IO_MAGIC => {
            let off = cur.pos();
            let seq_id = cur.i32("seq_id")?;
            if seq_id < 0 || seq_id as u32 >= MAX_SEQ {
                return Err(Error::format(
                    "seq_id",
                    off,
                    format!("0 to {}", MAX_SEQ - 1),
                    seq_id,
                ));
            }
            let p = Prefix {
                container: Container::RawSeq,
                version: None,
                seq_id: Some(seq_id),
                arch: None,
                tokens: None,
                server_tokens: None,
                outputs: None,
                regions: vec![region(0, 8, "io header", "meta")],
                features: vec!["io magic"],
                memory: 8,
            };
            candidates.push((p, vec![new]));
        }
        GGUF_MAGIC => {
            return Err(Error::format(
                "magic",
                0,
                "a llama.cpp state (GGSQ, GGSN, io magic or raw state bytes)",
                "GGUF: a model file, not a state",
            ))
        }
        _ => {
            if let Some(e) = not_a_state(&buf, magic) {
                return Err(e);
            }
            // No magic: a raw whole-context state (arch first) or raw sequence bytes of an
            // older build. Every reading is tried; exactly one must consume the bytes.
            let cur0 = Cursor::at(buf, 0);
            let raw = |container| Prefix {
                container,
                version: None,
                seq_id: None,
                arch: None,
                tokens: None,
                server_tokens: None,
                outputs: None,
                regions: vec![],
                features: vec![],
                memory: 0,
            };
            let mut errors: Option<Error> = None;
            for (with_outputs, readings) in [(false, vec![new]), (true, old.to_vec())] {
                match state_prefix(cur0, raw(Container::RawState), with_outputs) {
                    Ok(p) => candidates.push((p, readings)),
                    Err(e) => errors = Some(furthest(errors, e)),
                }
            }
            let mut p = raw(Container::RawSeq);
            p.features.push("no io magic");
            candidates.push((p, old.to_vec()));
            return choose(buf, candidates, opts, errors);
        }
    }
    choose(buf, candidates, opts, None)
}

/// Bytes with no magic whose first word begins no reading (an arch name length, a stream count,
/// or a cell count whose cells fit in the bytes) are not a llama.cpp state: say so, rather than
/// how one reading failed (a text file read as a count of 1.8 billion cells).
fn not_a_state(buf: &[u8], first: u32) -> Option<Error> {
    let arch = (1..=MAX_ARCH_LEN).contains(&first);
    let streams = (1..=MAX_SEQ).contains(&first);
    // a cell takes at least 8 bytes (its position and its sequence count)
    let cells = u64::from(first) * 8 <= buf.len().saturating_sub(4) as u64;
    if arch || streams || cells {
        return None;
    }
    let start: String = buf
        .iter()
        .take(8)
        .map(|&b| match b {
            b' '..=b'~' => b as char,
            _ => '.',
        })
        .collect();
    Some(Error::format(
        "magic",
        0,
        "a llama.cpp state (GGSQ, GGSN, io magic or raw state bytes)",
        format!(
            "{first:#010x} (\"{start}\"): not a llama.cpp state (no magic, and the first word is no arch \
             name length 1 to {MAX_ARCH_LEN}, stream count 1 to {MAX_SEQ} nor count of cells that \
             fit in the file's {} bytes)",
            buf.len()
        ),
    ))
}

/// Arch string, then for older states the outputs, logits and embeddings.
fn state_prefix(mut cur: Cursor, mut p: Prefix, with_outputs: bool) -> Result<Prefix> {
    let off = cur.pos();
    let len = cur.u32("arch_len")?;
    if len == 0 || len > MAX_ARCH_LEN {
        return Err(Error::format(
            "arch_len",
            off,
            format!("1 to {MAX_ARCH_LEN}"),
            len,
        ));
    }
    let name = cur.take(len as u64, "arch name")?;
    if !is_arch_name(name) {
        return Err(Error::format(
            "arch name",
            off + 4,
            "an architecture name ([A-Za-z0-9_.-])",
            String::from_utf8_lossy(name).escape_debug(),
        ));
    }
    p.arch = Some(String::from_utf8_lossy(name).into_owned());
    p.regions
        .push(region(off, 4 + len as usize, "arch", "meta"));
    if with_outputs {
        let o_off = cur.pos();
        let n_out = cur.u32("n_outputs")?;
        let output_pos = cur.i32_array(n_out as u64, &format!("output_pos ({n_out} positions)"))?;
        p.regions
            .push(region(o_off, cur.pos() - o_off, "outputs", "meta"));
        let mut floats = |what_count: &'static str, what: &'static str| -> Result<(u64, u64)> {
            let c_off = cur.pos();
            let n = cur.u64(what_count)?;
            p.regions.push(region(c_off, 8, what_count, "meta"));
            let d_off = cur.skip(n.saturating_mul(4), &format!("{what} ({n} floats)"))?;
            p.regions
                .push(region(d_off, n as usize * 4, what, "outputs"));
            Ok((d_off as u64, n))
        };
        let (logits_offset, n_logits) = floats("n_logits", "logits")?;
        let (embd_offset, n_embd) = floats("n_embeddings", "embeddings")?;
        p.outputs = Some(Outputs {
            offset: o_off as u64,
            output_pos,
            logits_offset,
            n_logits,
            embd_offset,
            n_embd,
        });
        p.features.push("outputs");
    }
    p.memory = cur.pos();
    Ok(p)
}

/// Whether the memory ends with a recurrent part, as far as the options and the arch tell: the
/// readings to try (recurrent, or not) and whether a recurrent reading is expected.
fn recurrent_readings(p: &Prefix, opts: WalkOptions) -> (&'static [bool], bool) {
    if let Some(h) = opts.recurrent {
        return if h.layers > 0 {
            (&[true], true)
        } else {
            (&[false], false)
        };
    }
    let arch = p.arch.as_deref().unwrap_or("");
    if crate::model::arch::is_recurrent(arch) || crate::model::arch::is_hybrid(arch) {
        return (&[true], true);
    }
    (&[false, true], false)
}

/// A recurrent model's memory (the state's arch is one llama.cpp gives a recurrent memory only)
/// is the recurrent part alone, with R and S records for every layer.
fn arch_agrees(p: &Prefix, caches: &[Cache]) -> Result<()> {
    let arch = p.arch.as_deref().unwrap_or("");
    if !crate::model::arch::is_recurrent(arch) {
        return Ok(());
    }
    let Some(r) = caches.iter().find(|c| c.memory.is_recurrent()) else {
        return Ok(());
    };
    if caches.len() > 1 {
        return Err(Error::format(
            "cache 0",
            caches[0].offset as usize,
            format!("the recurrent part: {arch} keeps no attention cache"),
            "an attention cache",
        ));
    }
    if let (Memory::Recurrent { n_layer }, Some(s)) = (r.memory, r.streams.first()) {
        if s.layers.len() != n_layer as usize {
            return Err(Error::format(
                "recurrent part records",
                s.layer_header_offset as usize + 8,
                format!("R and S records for each of the {n_layer} layers of {arch}"),
                format!("{} layers' records", s.layers.len()),
            ));
        }
    }
    Ok(())
}

/// A parse that held: its description, prefix, reading and caches.
type Held = (String, Prefix, Reading, Vec<Cache>);

/// What the readings of one pass gave.
#[derive(Default)]
struct Tried {
    ok: Vec<Held>,
    err: Option<Error>,
    /// Errors of readings that parsed to the end but break what llama.cpp guarantees: such a
    /// reading got furthest, so its error is the one to report when no reading holds.
    broken: Option<Error>,
}

fn attempt(
    buf: Bytes,
    candidates: &[(Prefix, Vec<Reading>)],
    opts: WalkOptions,
    v_less: bool,
) -> Tried {
    let kv_readings = candidates.iter().map(|c| c.1.len() * 2).sum::<usize>();
    let mut t = Tried::default();
    // errors of recurrent readings where one was not expected, kept apart
    let mut side: Option<Error> = None;
    for (prefix, readings) in candidates {
        let mut tried = readings.clone();
        tried.extend(readings.iter().map(|r| Reading { ext_bytes: 0, ..*r }));
        tried.dedup();
        let (rec, expected) = recurrent_readings(prefix, opts);
        for r in tried {
            if opts.cell_ext.is_some_and(|e| e != (r.ext_bytes > 0)) {
                continue;
            }
            let r = Reading {
                v_less,
                recurrent: false,
                ..r
            };
            // the KV caches are parsed once for both readings (with and without a recurrent part)
            let parsed = parse_memory(
                buf,
                prefix.memory,
                r,
                rec.contains(&false),
                rec.contains(&true),
                opts.recurrent,
            );
            for (recurrent, result) in [(false, parsed.kv), (true, parsed.recurrent)] {
                let Some(result) = result else { continue };
                let r = Reading { recurrent, ..r };
                let desc = format!("{} with {}", prefix.container.name(), r.describe());
                let many = kv_readings > 2 || (recurrent && !expected);
                let note = |e: Error| if many { e.in_reading(&desc) } else { e };
                match result {
                    Ok(c) => match check(prefix.container, prefix.seq_id, &c)
                        .and_then(|()| arch_agrees(prefix, &c))
                    {
                        Ok(()) => t.ok.push((desc, prefix.clone(), r, c)),
                        Err(e) => t.broken = Some(furthest(t.broken, note(e))),
                    },
                    // a recurrent reading nothing asked for: its error is reported only when no
                    // other reading got anywhere (the KV reading's error names what a user of a
                    // plain cache expects; model= makes the recurrent reading the expected one)
                    Err(e) if recurrent && !expected && !matches!(e, Error::Ambiguous { .. }) => {
                        side = Some(furthest(side, note(e)));
                    }
                    Err(e) => t.err = Some(furthest(t.err, note(e))),
                }
            }
        }
    }
    if t.err.is_none() {
        t.err = side;
    }
    // Readings that find the same regions (they differ only in an extension no cell carries, or
    // in n_stream where the memory has no attention cache) are the same reading.
    let mut seen: Vec<(Container, usize, Vec<Vec<u64>>)> = Vec::new();
    t.ok.retain(|h| {
        let key = (h.1.container, h.1.memory, signature(&h.3));
        if seen.contains(&key) {
            return false;
        }
        seen.push(key);
        true
    });
    t
}

/// Where a reading found every cache, stream, cell meta and record header.
fn signature(caches: &[Cache]) -> Vec<Vec<u64>> {
    caches
        .iter()
        .map(|c| {
            let mut v = vec![c.offset, c.memory.is_recurrent() as u64];
            for s in &c.streams {
                v.extend([
                    s.offset,
                    s.cell_count as u64,
                    s.meta_len,
                    s.layer_header_offset,
                ]);
                for l in &s.layers {
                    v.push(l.k.header_offset);
                    v.extend(l.v.as_ref().map(|r| r.header_offset));
                }
            }
            v
        })
        .collect()
}

/// The readings of the bytes `llama_state_seq_get_data_ext` writes with
/// `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE`: the raw sequence container (the only one the flags reach),
/// every header and cell, no row. Tried only when no reading with rows holds (a state with no
/// cell is the same bytes either way).
fn device_readings(candidates: &[(Prefix, Vec<Reading>)]) -> Vec<(Prefix, Vec<Reading>)> {
    candidates
        .iter()
        .filter(|(p, _)| p.container == Container::RawSeq && p.seq_id.is_some())
        .map(|(p, rs)| {
            let rs = rs.iter().map(|r| Reading { device: true, ..*r });
            (p.clone(), rs.collect())
        })
        .collect()
}

/// Try every candidate reading; exactly one must consume the bytes.
fn choose(
    buf: Bytes,
    candidates: Vec<(Prefix, Vec<Reading>)>,
    opts: WalkOptions,
    prior: Option<Error>,
) -> Result<Layout> {
    if let Some(e) = unread_memory(buf, &candidates) {
        return Err(e);
    }
    let v_less = opts.v_less == Some(true);
    let mut t = attempt(buf, &candidates, opts, v_less);
    let device = device_readings(&candidates);
    let mut candidates = candidates;
    if t.ok.is_empty() && !device.is_empty() {
        let d = attempt(buf, &device, opts, v_less);
        if !d.ok.is_empty() {
            t.ok = d.ok;
        }
        // the V-less test below reads the device readings too
        candidates.extend(device);
    }
    if t.ok.is_empty() && opts.v_less.is_none() {
        // The bytes may hold K records only: a V-less (MLA) cache, or a cache cut before its V
        // records. Only the model tells them apart.
        let alt = attempt(buf, &candidates, opts, true);
        if let Some((desc, p, _, caches)) = alt.ok.first() {
            let (ci, c) = caches
                .iter()
                .enumerate()
                .rev()
                .find(|(_, c)| !c.memory.is_recurrent() && c.cells() > 0)
                .unwrap_or((0, &caches[0]));
            let s = c
                .streams
                .iter()
                .find(|s| s.cell_count > 0)
                .unwrap_or(&c.streams[0]);
            let end = s.layers.last().map_or(s.layer_header_offset + 8, |l| {
                l.k.data_offset + l.k.data_len
            });
            return Err(Error::Ambiguous {
                field: format!(
                    "cache {ci} stream {} V records (whether the cache has V is the model's to \
                     say: give the model, the GGUF: model= in Python, --model on the command line)",
                    s.index
                ),
                offset: end,
                readings: vec![
                    format!("{desc}: a V-less (MLA) cache{}", arch_note(p)),
                    "a state cut between its K and V records".into(),
                ],
            });
        }
    }
    let mut err = prior;
    if let Some(e) = t.err.take() {
        err = Some(furthest(err, e));
    }
    let mut ok = t.ok;
    match ok.len() {
        0 => Err(t.broken.or(err).unwrap_or_else(|| {
            Error::format(
                "cell extension",
                0,
                "a reading allowed by the options",
                "none",
            )
        })),
        1 => {
            let (_, p, r, caches) = ok.pop().expect("one reading");
            let attention = caches.iter().any(|c| !c.memory.is_recurrent());
            let has_cells = caches
                .iter()
                .any(|c| !c.memory.is_recurrent() && c.cells() > 0);
            let ext_bytes = if has_cells { r.ext_bytes } else { 0 };
            let mut features = p.features;
            if attention {
                features.push(if r.n_stream {
                    "n_stream"
                } else {
                    "no n_stream"
                });
            }
            if ext_bytes > 0 {
                features.push(if ext_bytes == 12 {
                    "cell ext 12"
                } else {
                    "cell ext 8"
                });
            }
            if r.v_less && attention {
                features.push("V-less");
            }
            if r.recurrent {
                features.push("recurrent part");
            }
            if r.device {
                features.push("rows on device");
            }
            Ok(Layout {
                size: buf.len() as u64,
                container: p.container,
                version: p.version,
                seq_id: p.seq_id,
                arch: p.arch,
                tokens: p.tokens,
                server_tokens: p.server_tokens,
                outputs: p.outputs,
                ext_bytes,
                features,
                prefix: p.regions,
                caches,
                rows_on_device: r.device,
            })
        }
        _ => Err(Error::Ambiguous {
            field: "state layout".into(),
            offset: ok.iter().map(|o| o.1.memory as u64).min().unwrap_or(0),
            readings: ok.into_iter().map(|o| o.0).collect(),
        }),
    }
}

/// A memory kvfast does not read yet, told by its magic where the first KV cache would start:
/// DeepSeek V4's DSV4 container is refused as such, never read as a stream count.
fn unread_memory(buf: Bytes, candidates: &[(Prefix, Vec<Reading>)]) -> Option<Error> {
    candidates.iter().find_map(|(p, _)| {
        let magic = Cursor::at(buf, p.memory).u32("memory").ok();
        if magic == Some(DSV4_MAGIC) {
            return Some(Error::format(
                "memory",
                p.memory,
                "a KV cache or recurrent part",
                format!(
                    "\"DSV4\", the magic of DeepSeek V4's memory (the DSV4 container: \
                     sliding-window caches, compressed K blocks, compressor states){}, which \
                     kvfast does not read yet",
                    arch_note(p)
                ),
            ));
        }
        // a whole state names its arch: a memory kvfast does not read yet is refused as such
        let arch = p.arch.as_deref()?;
        crate::model::memory::unread(arch).map(|what| {
            Error::format(
                "memory",
                p.memory,
                "a memory kvfast reads",
                format!("{what} of a {arch} state, which kvfast does not read yet"),
            )
        })
    })
}

fn arch_note(p: &Prefix) -> String {
    match &p.arch {
        Some(a) => match crate::model::memory::family(a) {
            Some(f) => format!(" (the state's arch is {a}: {f})"),
            None => format!(" (the state's arch is {a})"),
        },
        None => String::new(),
    }
}
