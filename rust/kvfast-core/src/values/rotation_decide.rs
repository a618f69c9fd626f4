//! Deciding, per cache and kind, whether llama.cpp's attention rotation is undone (values in the
//! model's basis), and on what evidence (the rule itself is in [`crate::values::rotation`]).
//!
//! Nothing in the bytes records the rotation. `Mode::Auto` undoes it where the evidence says
//! llama.cpp rotated, in this order: the rule (an f16 cache, or a head size that is not a multiple
//! of 64, is never rotated; a V-less MLA cache alone is read through llama.cpp's K-only attention,
//! which does not rotate: so in `Mode::Hadamard` too), what the build that wrote the state recorded
//! (a probe manifest), the container's era, and last the values themselves: rotated rows look
//! Gaussian (kurtosis about 3), real keys have outlier channels. One build wrote every cache of a
//! state and rotates K and V alike, so where one cache and kind's values showed whether it rotates,
//! the rule decides those whose values cannot tell ([`one_build`]). Without the head size K's group
//! is read from RoPE's pairs ([`crate::values::rope_pairs`]), never from the kurtosis (a group twice
//! or half llama.cpp's keeps the outliers), and where they cannot tell K is left as stored. The
//! values test reads at most [`SAMPLE_CELLS`] cells (the middle ones, away from attention sinks)
//! of at most [`SAMPLE_LAYERS`] records per cache and kind ([`sample_ranges`]: the bytes a remote
//! state must have fetched first; bytes not there read as NaN, never out of bounds), never a whole
//! record: its cost does not grow with the context. Where none of these can tell, the values are
//! left as stored and the decision is marked uncertain ([`warning`] says so, naming the options).

use crate::format::layout::{Kind, Layout, Record};
use crate::format::types::GgmlType;
use crate::model::memory::Basis;
use crate::source::state::State;
use crate::values::rope_pairs::{self, Advances, Reading};
use crate::values::rotation::{era, hadamard_groups, k_group, k_only, v_group, Era, MIN_GROUP};
use crate::values::view::RecordView;
use rayon::prelude::*;

/// Cells per record, and records per cache and kind, that the values test reads.
pub const SAMPLE_CELLS: usize = 32;
pub const SAMPLE_LAYERS: usize = 6;
/// How much larger one basis's kurtosis must be than the other's to count as evidence: on its own,
/// and where the container already says the build rotated (the values then only confirm the group).
const MARGIN: f64 = 2.0;
const MARGIN_CONFIRM: f64 = 1.4;
const MIN_KURTOSIS: f64 = 5.0;

/// `kvfast.open(..., rotation=...)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Undo it where the evidence says llama.cpp rotated.
    Auto,
    /// Undo it wherever llama.cpp's rule applies.
    Hadamard,
    /// Values as stored.
    None,
}

impl Mode {
    pub const NAMES: [&'static str; 3] = ["auto", "hadamard", "none"];

    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "auto" => Some(Mode::Auto),
            "hadamard" => Some(Mode::Hadamard),
            "none" => Some(Mode::None),
            _ => None,
        }
    }
}

/// What the build that wrote a state recorded about the rotation (a probe manifest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildHint {
    pub rotates: bool,
    pub evidence: String,
}

/// What was decided for one kind of one attention cache, and on what evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub cache: usize,
    pub kind: Kind,
    /// The cache type's name (of its first record of this kind).
    pub ty: &'static str,
    /// Whether values are read in the model's basis (the rotation undone).
    pub undone: bool,
    /// The group the Hadamard matrix is applied in (None when not undone).
    pub group: Option<usize>,
    pub evidence: String,
    /// False when the decision is a default taken for want of evidence.
    pub certain: bool,
}

/// `rotation="hadamard"` where the group llama.cpp rotated in cannot be known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cache {cache} {kind}: rotation='hadamard' needs the head size to know the group (one of \
     {candidates:?}): pass head_dim= or model=",
    kind = .kind.name().to_uppercase()
)]
pub struct RotationError {
    pub cache: usize,
    pub kind: Kind,
    pub candidates: Vec<usize>,
}

/// One record of a cache, with its stream's cell count and cell positions.
type Rec<'a> = (&'a Record, usize, &'a [i32]);

/// The records of one kind of one cache, with their stream's cell count, streams outer.
fn records(layout: &Layout, cache: usize, kind: Kind) -> Vec<Rec<'_>> {
    let c = &layout.caches[cache];
    c.streams
        .iter()
        .flat_map(|s| {
            s.layers.iter().filter_map(move |l| {
                l.record(kind)
                    .map(|r| (r, s.cell_count as usize, s.pos.as_slice()))
            })
        })
        .collect()
}

/// The records the values test reads of one cache and kind: every `len / SAMPLE_LAYERS`-th.
fn sampled<'a>(recs: &[Rec<'a>]) -> Vec<Rec<'a>> {
    let step = (recs.len() / SAMPLE_LAYERS).max(1);
    recs.iter()
        .step_by(step)
        .take(SAMPLE_LAYERS)
        .copied()
        .collect()
}

/// The byte ranges (offset, length) the values test may read: what a remote state must have
/// fetched before [`decide`] (the middle [`SAMPLE_CELLS`] cells of each sampled record,
/// [`sample_start`]).
pub fn sample_ranges(layout: &Layout) -> Vec<(u64, u64)> {
    let mut out = vec![];
    for ci in 0..layout.caches.len() {
        if layout.caches[ci].memory.is_recurrent() {
            continue;
        }
        for kind in Kind::BOTH {
            for (rec, cells, _) in sampled(&records(layout, ci, kind)) {
                if rec.ty.is_float() {
                    continue; // never rotated: never read
                }
                if rec.transposed {
                    out.push((rec.data_offset, rec.data_len));
                    continue;
                }
                let start = rec.data_offset + sample_start(cells) as u64 * rec.row_bytes;
                let len = cells.min(SAMPLE_CELLS) as u64 * rec.row_bytes;
                let end = (start + len).min(rec.data_offset + rec.data_len);
                if end > start {
                    out.push((start, end - start));
                }
            }
        }
    }
    out
}

/// Decide for every attention cache and kind (see the module's docs). `head_dims`: per cache, the
/// K and V head sizes shared by its layers (None, or no entry: not known); `bases`: per cache, how
/// the model's memory stores its K rows (an indexer cache's K is rotated, or not, at every type:
/// no evidence is needed, nor taken from it); `hint`: what a probe manifest recorded.
pub fn decide(
    state: &State,
    head_dims: &[[Option<u64>; 2]],
    bases: &[Basis],
    mode: Mode,
    hint: Option<&BuildHint>,
) -> Result<Vec<Decision>, RotationError> {
    let layout = &state.layout;
    let attention: Vec<usize> = (0..layout.caches.len())
        .filter(|&ci| !layout.caches[ci].memory.is_recurrent())
        .collect();
    let mut out = vec![];
    for &ci in &attention {
        for kind in Kind::BOTH {
            let basis = bases.get(ci).copied().unwrap_or(Basis::Rule);
            if kind == Kind::K && basis != Basis::Rule {
                if let Some(d) = by_basis(layout, ci, basis, mode) {
                    out.push((d, Build::default()));
                }
                continue;
            }
            let ctx = Ctx {
                state,
                cache: ci,
                kind,
                head_dim: head_dims.get(ci).and_then(|h| h[kind.index()]),
                mode,
                hint,
                k_only: k_only(layout, ci),
            };
            let mut build = Build::default();
            if let Some(d) = ctx.decide(&mut build)? {
                out.push((d, build));
            }
        }
    }
    Ok(one_build(out))
}

/// The K decision of a cache whose memory stores its K in one basis at every type.
fn by_basis(layout: &Layout, cache: usize, basis: Basis, mode: Mode) -> Option<Decision> {
    let (first, _, _) = *records(layout, cache, Kind::K).first()?;
    let (undone, group, evidence) = match (basis, mode) {
        (_, Mode::None) => (false, None, "rotation='none': values as stored".to_string()),
        (Basis::Rotated(g), _) => (
            g > 0,
            (g > 0).then_some(g),
            format!(
                "an indexer cache: llama.cpp's graph stores the indexer's K multiplied by the \
                 Hadamard matrix (groups of {g}) at every type"
            ),
        ),
        _ => (
            false,
            None,
            "llama.cpp stores this cache's K as computed at every type (a DSA memory's MLA cache, \
             written by its K-only attention; an MSA indexer cache)"
                .to_string(),
        ),
    };
    Some(Decision {
        cache,
        kind: Kind::K,
        ty: first.ty.name(),
        undone,
        group,
        evidence,
        certain: true,
    })
}

/// One build wrote every cache of a state, and it rotates K and V alike (`LLAMA_ATTN_ROT_DISABLE`
/// turns off both): where the values of some cache and kind showed whether it rotates, and those of
/// another could not tell, the rule decides the other in that build's way (a whole state of
/// Gemma 3, say: its keys show the rotation, its values, Gaussian in either basis, do not).
fn one_build(decided: Vec<(Decision, Build)>) -> Vec<Decision> {
    let witness = decided
        .iter()
        .find(|(_, b)| b.proves.is_some())
        .map(|(d, b)| (d.cache, d.kind, b.proves == Some(true)));
    let agree = decided
        .iter()
        .filter_map(|(_, b)| b.proves)
        .all(|p| Some(p) == witness.map(|w| w.2));
    // K and V of a cache have the same KV heads: K's RoPE pairs give V's head size
    let k_heads: Vec<(usize, u64)> = decided
        .iter()
        .filter_map(|(d, b)| b.heads.map(|h| (d.cache, h)))
        .collect();
    let proven = witness.filter(|_| agree).map(|w| w.2);
    decided
        .into_iter()
        .map(|(mut d, mut b)| {
            let heads = k_heads.iter().find(|(c, _)| *c == d.cache).map(|h| h.1);
            if let (false, Some(n), Some(w)) = (d.certain, heads, b.width) {
                if n > 0 && w % n == 0 && b.believed.or(proven) == Some(true) {
                    let hd = w / n;
                    let ty = GgmlType::from_name(d.ty);
                    let g = ty.and_then(|t| v_group(t, Some(hd))).unwrap_or(0);
                    d.evidence = format!(
                        "{}; K's RoPE pairs show {n} KV heads, so V heads of {hd}",
                        d.evidence
                    );
                    d.undone = g > 0;
                    d.group = (g > 0).then_some(g);
                    d.certain = true;
                    b.rule = None;
                }
            }
            if let (Some((cache, kind, rotates)), true, false, Some(g)) =
                (witness, agree, d.certain, b.rule)
            {
                let does = if rotates {
                    "rotates"
                } else {
                    "does not rotate"
                };
                d.evidence = format!(
                    "{}; the build {does} (cache {cache} {}'s values show it; llama.cpp rotates K \
                     and V alike), so llama.cpp's rule decides",
                    d.evidence,
                    kind.name().to_uppercase()
                );
                d.undone = rotates;
                d.group = rotates.then_some(g);
                d.certain = true;
            }
            d
        })
        .collect()
}

/// What a user is told when some decision is a default taken for want of evidence: what is
/// undecided and the advice (`text`, the same for every state of a build), and the evidence
/// (`evidence`, what this state's values said).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub text: String,
    pub evidence: String,
}

/// The [`Notice`] for a state's decisions (None: every decision is certain).
pub fn warning(decisions: &[Decision]) -> Option<Notice> {
    let undecided: Vec<&Decision> = decisions.iter().filter(|d| !d.certain).collect();
    let first = undecided.first()?;
    let which: Vec<String> = undecided
        .iter()
        .map(|d| {
            let what = match d.group {
                Some(g) if d.undone => format!("undone in groups of {g}, a guess"),
                _ => "left as stored".to_string(),
            };
            format!(
                "cache {} {} ({}: {what})",
                d.cache,
                d.kind.name().to_uppercase(),
                d.ty
            )
        })
        .collect();
    Some(Notice {
        text: format!(
            "kvfast cannot be sure how llama.cpp stored {}: since April 2026 it stores quantized \
             caches Hadamard-rotated in groups set by the head size, which the state does not \
             record. Pass model= or head_dim= (or rotation='hadamard' / rotation='none') to decide.",
            which.join(", ")
        ),
        evidence: format!("Evidence: {}.", first.evidence),
    })
}

struct Ctx<'a> {
    state: &'a State,
    cache: usize,
    kind: Kind,
    head_dim: Option<u64>,
    mode: Mode,
    hint: Option<&'a BuildHint>,
    k_only: bool,
}

/// What RoPE's pairs say: the reading that leads clearly (None: none does), and the measurements.
type Paired = (Option<Reading>, String);

/// What the values say: the group whose undoing gives values with outlier channels (`Some(g)`),
/// values that already have them as stored (`Some(0)`), or no clear answer (None); the kurtoses
/// measured; and, where asked, what RoPE's pairs say.
type Measured = (Option<usize>, String, Option<Paired>);

/// What one decision's values say of the build that wrote the state, where neither a manifest nor
/// the container's era did: whether it rotates (`proves`), and for a decision the values left
/// open, the group llama.cpp's rule gives that cache and kind (`rule`); for K read by RoPE's pairs,
/// the KV heads they showed (`heads`); for V the values left open with no head size, whether the
/// build is believed to rotate (`believed`) and the V rows' width (`width`).
#[derive(Debug, Default, Clone, Copy)]
struct Build {
    proves: Option<bool>,
    rule: Option<usize>,
    heads: Option<u64>,
    believed: Option<bool>,
    width: Option<u64>,
}

impl Ctx<'_> {
    fn decide(&self, build: &mut Build) -> Result<Option<Decision>, RotationError> {
        let recs = records(&self.state.layout, self.cache, self.kind);
        let Some(&(first, _, _)) = recs.first() else {
            return Ok(None);
        };
        let ty = first.ty;
        let rot = |undone: bool, group: Option<usize>, evidence: String, certain: bool| {
            Some(Decision {
                cache: self.cache,
                kind: self.kind,
                ty: ty.name(),
                undone,
                group: if undone { group } else { None },
                evidence,
                certain,
            })
        };
        if self.mode == Mode::None {
            return Ok(rot(
                false,
                None,
                "rotation='none': values as stored".into(),
                true,
            ));
        }
        if ty.is_float() {
            let why = format!(
                "{} cache: llama.cpp rotates only quantized caches",
                ty.name()
            );
            return Ok(rot(false, None, why, true));
        }
        if self.k_only && self.kind == Kind::K {
            // the rule, in every mode that applies it (rotation='hadamard' included)
            let why = "a V-less (MLA) cache of one attention cache: llama.cpp's K-only attention \
                       does not rotate K";
            return Ok(rot(false, None, why.into(), true));
        }
        let (candidates, known) = match self.head_dim {
            Some(hd) => {
                let group = match self.kind {
                    Kind::K => k_group(ty, Some(hd)),
                    _ => v_group(ty, Some(hd)),
                };
                let Some(g) = group else {
                    let why = format!(
                        "head size {hd} is not a multiple of 64: llama.cpp does not rotate"
                    );
                    return Ok(rot(false, None, why, true));
                };
                (vec![g], format!("head size {hd}"))
            }
            None => {
                let mut n_embd: Vec<u64> = recs.iter().map(|(r, _, _)| r.n_embd).collect();
                n_embd.sort_unstable();
                n_embd.dedup();
                let common: Vec<usize> = groups(n_embd[0])
                    .into_iter()
                    .filter(|g| n_embd.iter().all(|n| groups(*n).contains(g)))
                    .filter(|&g| self.kind == Kind::K || g == MIN_GROUP)
                    .collect();
                if common.is_empty() {
                    let why =
                        format!("rows of {n_embd:?} values hold no group of 64: never rotated");
                    return Ok(rot(false, None, why, true));
                }
                (common, String::new())
            }
        };
        // K's group, where the head size is not known and several groups fit the rows: RoPE's
        // pairs tell it (rope_pairs), or nothing does
        let pairs = self.head_dim.is_none() && candidates.len() > 1;
        if self.mode == Mode::Hadamard {
            if self.head_dim.is_some() {
                let why = format!("rotation='hadamard' ({known})");
                return Ok(rot(true, Some(candidates[0]), why, true));
            }
            let (g, ev, read) = self.by_values(&recs, &candidates, MARGIN, pairs, true);
            let group = if pairs {
                read.as_ref().and_then(|(r, _)| *r).map(|r| r.group)
            } else {
                g.filter(|&g| g > 0)
            };
            let text = read.map_or(ev, |(_, t)| t);
            return match group {
                Some(g) => {
                    let why = format!("rotation='hadamard', group {g} by the values ({text})");
                    Ok(rot(true, Some(g), why, true))
                }
                None => Err(RotationError {
                    cache: self.cache,
                    kind: self.kind,
                    candidates,
                }),
            };
        }
        let (believed, why) = match self.hint {
            Some(h) => (Some(h.rotates), h.evidence.clone()),
            None => {
                let (e, evidence) = era(&self.state.layout);
                let believed = match e {
                    Era::After => Some(true),
                    Era::Before => Some(false),
                    Era::Either => None,
                };
                (believed, evidence.to_string())
            }
        };
        if believed == Some(false) {
            return Ok(rot(false, None, why, true));
        }
        if believed == Some(true) && self.head_dim.is_some() {
            return Ok(rot(
                true,
                Some(candidates[0]),
                format!("{why}; {known}"),
                true,
            ));
        }
        let margin = if believed == Some(true) {
            MARGIN_CONFIRM
        } else {
            MARGIN
        };
        let (g, ev, read) = self.by_values(&recs, &candidates, margin, pairs, false);
        // what the values decide here they decide of the build (believed: a manifest or the era did)
        let decided = |undone: bool| believed.is_none().then_some(undone);
        if let Some((reading, text)) = read {
            build.proves = reading.and_then(|r| decided(r.group > 0));
            build.heads = reading.map(|r| first.n_embd / r.head as u64);
            return Ok(match reading {
                Some(r) if r.group > 0 => rot(
                    true,
                    Some(r.group),
                    format!(
                        "{why}; values: {text}: groups of {}, heads of {} ({ev})",
                        r.group, r.head
                    ),
                    true,
                ),
                Some(r) => rot(
                    false,
                    None,
                    format!(
                        "{why}; values: {text}: as stored, heads of {} ({ev})",
                        r.head
                    ),
                    true,
                ),
                None => rot(
                    false,
                    None,
                    format!(
                        "{why}; values: {text}; {ev}: without the head size the group cannot be \
                         told (one of {candidates:?}), so the values are left as stored"
                    ),
                    false,
                ),
            });
        }
        build.proves = g.and_then(|g| decided(g > 0));
        build.rule = self.head_dim.map(|_| candidates[0]);
        if self.head_dim.is_none() && self.kind == Kind::V {
            build.believed = believed;
            build.width = Some(first.n_embd);
        }
        Ok(match g {
            Some(g) if g > 0 => rot(true, Some(g), format!("{why}; values: {ev}"), true),
            Some(_) => rot(false, None, format!("{why}; values: {ev}"), true),
            None => rot(false, None, format!("{why}; values: {ev}"), false),
        })
    }

    /// Measured on a sample of records: the basis of largest median kurtosis wins if it is clearly
    /// non-Gaussian and clearly above the other reading (as stored, or undone). With `pairs`, also
    /// what RoPE's pairs say of every reading the rule allows ([`rope_pairs`]; `undone_only`:
    /// readings of a group only).
    fn by_values(
        &self,
        recs: &[Rec],
        candidates: &[usize],
        margin: f64,
        pairs: bool,
        undone_only: bool,
    ) -> Measured {
        let readings: Vec<Reading> = if pairs {
            let widths: Vec<u64> = recs.iter().map(|(r, _, _)| r.n_embd).collect();
            rope_pairs::readings(&widths, candidates)
                .into_iter()
                .filter(|r| !undone_only || r.group > 0)
                .collect()
        } else {
            vec![]
        };
        // per record: the kurtosis as stored, then undone in each candidate group (in parallel),
        // and the advances of each reading
        let per_layer: Vec<(Vec<f64>, Vec<Advances>)> = crate::parallel::install(|| {
            sampled(recs)
                .into_par_iter()
                .filter_map(|(rec, cells, pos)| {
                    let n = cells.min(SAMPLE_CELLS);
                    let width = rec.n_embd as usize;
                    if n == 0 || width == 0 {
                        return None;
                    }
                    let c0 = sample_start(cells);
                    let mut x = vec![0f32; n * width];
                    RecordView::new(self.state.bytes(), rec, cells).decode(c0, c0 + n, &mut x);
                    let pos = pos.get(c0..c0 + n).unwrap_or(&[]);
                    Some(measure(x, width, pos, candidates, &readings))
                })
                .collect()
        });
        if per_layer.is_empty() {
            return (None, "no cells to measure".into(), None);
        }
        let read = pairs.then(|| {
            let mut sums = vec![Advances::default(); readings.len()];
            for (_, a) in &per_layer {
                for (s, x) in sums.iter_mut().zip(a) {
                    s.add(x);
                }
            }
            rope_pairs::judge(&readings, &sums)
        });
        let median: Vec<f64> = (0..=candidates.len())
            .map(|i| median(per_layer.iter().map(|k| k.0[i]).collect()))
            .collect();
        let undone: Vec<String> = candidates
            .iter()
            .zip(&median[1..])
            .map(|(g, m)| format!("{m:.1} undone in groups of {g}"))
            .collect();
        let text = format!(
            "median kurtosis {:.1} as stored, {}",
            median[0],
            undone.join(", ")
        );
        // the first of the largest, as stored first
        let mut winner = 0;
        for (i, m) in median.iter().enumerate() {
            if *m > median[winner] {
                winner = i;
            }
        }
        if median[winner].is_nan() || median[winner] < MIN_KURTOSIS {
            return (None, text, read);
        }
        let clear = if winner == 0 {
            let best = median[1..]
                .iter()
                .cloned()
                .fold(f64::NEG_INFINITY, f64::max);
            median[0] >= margin * best
        } else {
            median[winner] >= margin * median[0]
        };
        let group = if winner == 0 {
            0
        } else {
            candidates[winner - 1]
        };
        (clear.then_some(group), text, read)
    }
}

/// The powers of two >= 64 dividing `n_embd`, ascending.
fn groups(n_embd: u64) -> Vec<usize> {
    let mut out = vec![];
    let mut n = MIN_GROUP as u64;
    while n_embd > 0 && n_embd % n == 0 {
        out.push(n as usize);
        n *= 2;
    }
    out
}

/// Pearson kurtosis of all values (3 for a Gaussian; 0 when they do not vary): one pass of raw
/// moments, shifted by the first value, summed in f32 lanes (so the loop vectorizes) a block of
/// 1,024 values at a time and the blocks in f64 (a relative error near 1e-6: the decision compares
/// kurtoses a factor 1.4 or more apart).
fn kurtosis(x: &[f32]) -> f64 {
    let Some(&first) = x.first() else {
        return 0.0;
    };
    let shift = first as f64;
    // blocks of 1,024 values summed in f32 lanes, the blocks' sums added in f64
    let mut t = [0f64; 4];
    let blocks = x.chunks_exact(1024);
    let rest = blocks.remainder();
    for block in blocks {
        let mut lanes = [[0f32; 16]; 4];
        for c in block.chunks_exact(16) {
            for i in 0..16 {
                let v = c[i] - first;
                let v2 = v * v;
                lanes[0][i] += v;
                lanes[1][i] += v2;
                lanes[2][i] += v2 * v;
                lanes[3][i] += v2 * v2;
            }
        }
        for (k, l) in lanes.iter().enumerate() {
            t[k] += l.iter().map(|&v| v as f64).sum::<f64>();
        }
    }
    for &v in rest {
        let v = v as f64 - shift;
        let v2 = v * v;
        t[0] += v;
        t[1] += v2;
        t[2] += v2 * v;
        t[3] += v2 * v2;
    }
    let n = x.len() as f64;
    let [m1, m2, m3, m4] = t.map(|s| s / n);
    let var = m2 - m1 * m1;
    let c4 = m4 - 4.0 * m1 * m3 + 6.0 * m1 * m1 * m2 - 3.0 * m1 * m1 * m1 * m1;
    if var > f64::EPSILON * m2 {
        c4 / (var * var)
    } else {
        0.0
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The first cell the values test reads of a stream of `cells`: the middle [`SAMPLE_CELLS`] of
/// them, away from the first cells, whose rows (attention sinks, the BOS token) can be large
/// enough to make a sample's kurtosis theirs.
pub fn sample_start(cells: usize) -> usize {
    (cells / 2).min(cells.saturating_sub(SAMPLE_CELLS))
}

/// The kurtosis of `x` (cells of `width` values at positions `pos`) as it is, then undone in each
/// of `groups` (ascending powers of two, each dividing the rows), and the RoPE pairs' advances of
/// each of `readings` (their groups among `groups`, or 0): one fast Walsh-Hadamard transform whose
/// stages are taken in turn, each reading measured after the stages that complete its group (a
/// group of 2g is two of g and one more stage; the scale of the orthonormal matrix leaves both
/// measures as they are). f32 values, as the decoder's transform, moments summed in f64.
fn measure(
    mut x: Vec<f32>,
    width: usize,
    pos: &[i32],
    groups: &[usize],
    readings: &[Reading],
) -> (Vec<f64>, Vec<Advances>) {
    let mut adv = vec![Advances::default(); readings.len()];
    let at = |x: &[f32], group: usize, adv: &mut [Advances]| {
        for (a, r) in adv.iter_mut().zip(readings) {
            if r.group == group {
                *a = rope_pairs::advances(x, width, pos, r.head);
            }
        }
    };
    at(&x, 0, &mut adv);
    let mut out = vec![kurtosis(&x)];
    let mut h = 1;
    for &g in groups {
        if h == 1 && g >= MIN_GROUP {
            // the first stages at once, with the decoder's SIMD transform (its scale is moot)
            hadamard_groups(&mut x, MIN_GROUP);
            h = MIN_GROUP;
        }
        while h < g {
            butterflies(&mut x, h);
            h *= 2;
        }
        out.push(kurtosis(&x));
        at(&x, g, &mut adv);
    }
    (out, adv)
}

/// One stage of the (unnormalised) fast Walsh-Hadamard transform: every block of `2h` values
/// becomes its sums and differences of the halves.
fn butterflies(x: &mut [f32], h: usize) {
    for block in x.chunks_exact_mut(2 * h) {
        let (a, b) = block.split_at_mut(h);
        for (p, q) in a.iter_mut().zip(b.iter_mut()) {
            let (u, v) = (*p, *q);
            *p = u + v;
            *q = u - v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_and_moments() {
        assert_eq!(groups(256), vec![64, 128, 256]);
        assert_eq!(groups(192), vec![64]);
        assert_eq!(groups(96), Vec::<usize>::new());
        assert_eq!(groups(0), Vec::<usize>::new());
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(kurtosis(&[1.0, 1.0]), 0.0);
        assert_eq!(sample_start(7), 0);
        assert_eq!(sample_start(40), 8);
        assert_eq!(sample_start(4096), 2048);
        // two values +-1: kurtosis 1
        assert!((kurtosis(&[1.0, -1.0, 1.0, -1.0]) - 1.0).abs() < 1e-12);
        // against the two-pass definition, off a mean far from 0
        let x: Vec<f32> = (0..1000)
            .map(|i| 100.0 + ((i * 37 % 101) as f32 - 50.0).powi(3) / 1e4)
            .collect();
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / 1000.0;
        let m = |k: i32| x.iter().map(|&v| (v as f64 - mean).powi(k)).sum::<f64>() / 1000.0;
        assert!((kurtosis(&x) - m(4) / (m(2) * m(2))).abs() < 1e-6);
    }

    #[test]
    fn the_staged_transform_is_the_hadamard_of_each_group() {
        // against the transform of each group on its own, in f32 (kvfast-core's decoder's)
        let x: Vec<f32> = (0..512)
            .map(|i| (i as f32 * 0.37).sin() + (i % 7) as f32)
            .collect();
        let got = measure(x.clone(), 512, &[], &[64, 128, 256], &[]).0;
        for (i, g) in [64usize, 128, 256].into_iter().enumerate() {
            let mut y = x.clone();
            crate::values::rotation::hadamard_groups(&mut y, g);
            let want = kurtosis(&y);
            assert!(
                (got[i + 1] - want).abs() < 1e-4 * want,
                "group {g}: {} against {want}",
                got[i + 1]
            );
        }
        assert_eq!(got[0], kurtosis(&x));
        // one outlier channel spreads over the group: the kurtosis falls towards a flat row's
        let mut spike = vec![0.01f32; 64];
        spike[5] = 10.0;
        let k = measure(spike, 64, &[], &[64], &[]).0;
        assert!(k[0] > 50.0 && k[1] < 2.0, "{k:?}");
    }

    #[test]
    fn the_warning_names_each_uncertain_decision() {
        let d = |cache, kind, undone, certain| Decision {
            cache,
            kind,
            ty: "q8_0",
            undone,
            group: undone.then_some(128),
            evidence: "median kurtosis 3.0 as stored".into(),
            certain,
        };
        assert_eq!(warning(&[d(0, Kind::K, true, true)]), None);
        let w = warning(&[d(0, Kind::K, true, false), d(1, Kind::V, false, false)]).unwrap();
        assert!(w.text.starts_with(
            "kvfast cannot be sure how llama.cpp stored cache 0 K (q8_0: undone in groups of 128, \
             a guess), cache 1 V (q8_0: left as stored): since April 2026"
        ));
        assert!(w
            .text
            .ends_with("(or rotation='hadamard' / rotation='none') to decide."));
        assert_eq!(w.evidence, "Evidence: median kurtosis 3.0 as stored.");
        assert_eq!(
            RotationError {
                cache: 1,
                kind: Kind::V,
                candidates: vec![64]
            }
            .to_string(),
            "cache 1 V: rotation='hadamard' needs the head size to know the group (one of [64]): \
             pass head_dim= or model="
        );
    }
}
