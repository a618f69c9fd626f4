//! Undoing llama.cpp's rotary position embedding (RoPE) of K rows: keys before RoPE.
//!
//! llama.cpp ropes K per head with ggml's rope (ggml-cpu ops.cpp: `ggml_rope_cache_init`,
//! `rope_yarn`, `rotate_pairs`): the pair (x0, x1) of dimension pair i (of the first `n_dims` of
//! each head) turns by theta_i = p * freq_base^(-2i/n_dims), scaled (linear: freq_scale; YaRN: a
//! ramp between the interpolated and extrapolated angle, and a magnitude `mscale`). NORM pairs
//! neighbours (2i, 2i + 1); NEOX pairs halves (i, i + n_dims / 2). Undoing it turns each pair back
//! by the same angle and divides by the magnitude. Per cell: the angle depends on the position.

/// One layer's rope parameters, as llama.cpp passes them to ggml_rope_ext.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    /// Values of each head that are roped (rope.dimension_count); the rest pass unchanged.
    pub n_dims: usize,
    /// Values per K head (the rope turns each head alike).
    pub head_dim: usize,
    pub freq_base: f32,
    /// 1 / the linear (or YaRN) scaling factor; 1: no scaling.
    pub freq_scale: f32,
    /// NEOX pairing (halves) rather than NORM (neighbours).
    pub neox: bool,
    /// YaRN's extrapolation mix (0: none, plain linear scaling).
    pub ext_factor: f32,
    /// Magnitude scale (YaRN's attention factor; 1 otherwise).
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// The context length the model was trained at (YaRN's correction dimensions).
    pub n_ctx_orig: u32,
    /// M-RoPE: dimension pairs per section (time, height, width, extra); all 0: plain RoPE.
    pub sections: [u32; 4],
    /// Interleaved M-RoPE (Qwen3-VL, Qwen3.5) rather than sections in a row (Qwen2-VL).
    pub imrope: bool,
}

/// Parameters read from a model are never NaN: equality is an equivalence on them.
impl Eq for Rope {}

impl Rope {
    /// Plain RoPE of `n_dims` dimensions and base `freq_base`, no scaling.
    pub fn plain(n_dims: usize, freq_base: f32, neox: bool) -> Self {
        Rope {
            n_dims,
            head_dim: n_dims,
            freq_base,
            freq_scale: 1.0,
            neox,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 0,
            sections: [0; 4],
            imrope: false,
        }
    }

    /// The angle's base position of dimension pair `i` under M-RoPE (ggml_mrope_cache_init, not
    /// vision): positions [time, height, width, extra].
    fn section_pos(&self, i: usize, p: [f32; 4]) -> f32 {
        let s = self.sections.map(|v| v as usize);
        let total: usize = s.iter().sum();
        if total == 0 {
            return p[0];
        }
        let sector = i % total;
        if self.imrope {
            if sector % 3 == 1 && sector < 3 * s[1] {
                p[1]
            } else if sector % 3 == 2 && sector < 3 * s[2] {
                p[2]
            } else if sector % 3 == 0 && sector < 3 * s[0] {
                p[0]
            } else {
                p[3]
            }
        } else if sector >= s[0] && sector < s[0] + s[1] {
            p[1]
        } else if sector >= s[0] + s[1] && sector < s[0] + s[1] + s[2] {
            p[2]
        } else if sector >= s[0] + s[1] + s[2] {
            p[3]
        } else {
            p[0]
        }
    }

    /// ggml_rope_yarn_corr_dims.
    fn corr_dims(&self) -> [f32; 2] {
        let dim = |n_rot: f32| {
            self.n_dims as f32
                * (self.n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * self.freq_base.ln())
        };
        let start = dim(self.beta_fast).floor();
        let end = dim(self.beta_slow).ceil();
        [start.max(0.0), end.min(self.n_dims as f32 - 1.0)]
    }

    /// (cos, sin) of each dimension pair at position `pos`, scaled by the magnitude, as
    /// ggml_rope_cache_init computes them.
    pub fn cache(&self, pos: i32) -> Vec<(f32, f32)> {
        let p = pos as f32;
        self.cache_at([p, p, p, p])
    }

    /// The same at M-RoPE positions [time, height, width, extra] (all the position for text).
    pub fn cache_at(&self, pos: [f32; 4]) -> Vec<(f32, f32)> {
        let theta_scale = self.freq_base.powf(-2.0 / self.n_dims as f32);
        let corr = self.corr_dims();
        let mut thetas = pos;
        let mut out = Vec::with_capacity(self.n_dims / 2);
        for i0 in (0..self.n_dims).step_by(2) {
            let theta = self.section_pos(i0 / 2, thetas);
            let interp = self.freq_scale * theta;
            let (mut t, mut mscale) = (interp, self.attn_factor);
            if self.ext_factor != 0.0 {
                let y = ((i0 / 2) as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
                let ramp = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
                t = interp * (1.0 - ramp) + theta * ramp;
                mscale *= 1.0 + 0.1 * (1.0 / self.freq_scale).ln();
            }
            out.push((t.cos() * mscale, t.sin() * mscale));
            for v in thetas.iter_mut() {
                *v *= theta_scale;
            }
        }
        out
    }

    /// Undo the rope of one row of heads of `head_dim` values each, at position `pos`.
    pub fn undo(&self, row: &mut [f32], head_dim: usize, pos: i32) {
        let p = pos as f32;
        self.undo_at(row, head_dim, [p, p, p, p]);
    }

    /// Undo the rope at M-RoPE positions [time, height, width, extra].
    pub fn undo_at(&self, row: &mut [f32], head_dim: usize, pos: [f32; 4]) {
        let n = self.n_dims.min(head_dim) & !1;
        if n == 0 || head_dim == 0 {
            return;
        }
        self.each_pair(row, head_dim, n, &self.cache_at(pos), |y0, y1, c, s| {
            // (y0, y1) = M (x0, x1), M = [[c, -s], [s, c]] = m R: x = R^T y / m^2
            let m2 = c * c + s * s;
            ((y0 * c + y1 * s) / m2, (y1 * c - y0 * s) / m2)
        });
    }

    /// Apply the rope (what llama.cpp does; for tests and round trips).
    pub fn apply(&self, row: &mut [f32], head_dim: usize, pos: i32) {
        let n = self.n_dims.min(head_dim) & !1;
        if n == 0 || head_dim == 0 {
            return;
        }
        self.each_pair(row, head_dim, n, &self.cache(pos), |x0, x1, c, s| {
            (x0 * c - x1 * s, x0 * s + x1 * c)
        });
    }

    /// Replace each rotary pair of the first `n` values of every head (NEOX: i and i + n/2; NORM:
    /// 2i and 2i + 1) by `f(first, second, cos, sin)` with its angle's (cos, sin) from `cache`.
    fn each_pair(
        &self,
        row: &mut [f32],
        head_dim: usize,
        n: usize,
        cache: &[(f32, f32)],
        f: impl Fn(f32, f32, f32, f32) -> (f32, f32),
    ) {
        for head in row.chunks_exact_mut(head_dim) {
            for (i, &(c, s)) in cache.iter().enumerate().take(n / 2) {
                let (a, b) = if self.neox {
                    (i, i + n / 2)
                } else {
                    (2 * i, 2 * i + 1)
                };
                (head[a], head[b]) = f(head[a], head[b], c, s);
            }
        }
    }
}

/// Per-cell undoing of the rope of one record's rows: the layer's parameters, the head size and
/// the position of every cell of the stream.
#[derive(Debug, Clone, Copy)]
pub struct CellRope<'a> {
    pub rope: Rope,
    pub pos: &'a [i32],
    /// The cells' extensions (x, y, token) and their width, for M-RoPE's height and width.
    pub ext: Option<(&'a [i32], usize)>,
}

impl CellRope<'_> {
    /// Undo the rope of cells `c0..` decoded in `out` (cell-major rows of `n_embd` values); a cell
    /// past the positions is left as it is.
    pub fn undo(&self, c0: usize, n_embd: usize, out: &mut [f32]) {
        if n_embd == 0 {
            return;
        }
        for (i, row) in out.chunks_exact_mut(n_embd).enumerate() {
            let c = c0 + i;
            let Some(&p) = self.pos.get(c) else {
                continue;
            };
            let t = p as f32;
            // llama.cpp keeps x (width) and y (height) in the extension; a text cell has both at
            // its position, and the extra section the position too
            let (w, h) = match self.ext {
                Some((e, width)) if width >= 2 => (
                    e.get(c * width).map_or(t, |v| *v as f32),
                    e.get(c * width + 1).map_or(t, |v| *v as f32),
                ),
                _ => (t, t),
            };
            self.rope.undo_at(row, self.rope.head_dim, [t, h, w, t]);
        }
    }
}

impl<'a> CellRope<'a> {
    /// The undoing of `rope` over the cells of `stream` (positions and extensions).
    pub fn of(rope: Rope, stream: &'a crate::format::layout::Stream) -> Self {
        CellRope {
            rope,
            pos: &stream.pos,
            ext: stream.ext.as_deref().map(|e| (e, stream.ext_width)),
        }
    }
}

/// The rope of every layer of every cache (None, or no entry: a layer llama.cpp does not rope,
/// or keys as stored).
pub type RopeSpec = Vec<Vec<Option<Rope>>>;

/// The rope to undo for `kind` rows of `layer` of `cache` (K only: llama.cpp ropes no V).
pub fn rope_of(
    spec: &RopeSpec,
    cache: u32,
    layer: u32,
    kind: crate::format::layout::Kind,
) -> Option<Rope> {
    if kind != crate::format::layout::Kind::K {
        return None;
    }
    *spec.get(cache as usize)?.get(layer as usize)?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Vec<f32> {
        (0..16)
            .map(|i| (i as f32 * 0.37).sin() + 0.1 * i as f32)
            .collect()
    }

    #[test]
    fn undo_inverts_apply_norm_neox_linear_and_yarn() {
        let mut ropes = vec![Rope::plain(8, 10000.0, false), Rope::plain(6, 1e6, true)];
        ropes.push(Rope {
            freq_scale: 0.25,
            ..Rope::plain(8, 10000.0, true)
        });
        ropes.push(Rope {
            freq_scale: 0.25,
            ext_factor: 1.0,
            attn_factor: 1.0,
            n_ctx_orig: 4096,
            ..Rope::plain(8, 10000.0, false)
        });
        for r in ropes {
            for pos in [0, 1, 7, 1000] {
                let mut x = row();
                r.apply(&mut x, 8, pos);
                if pos > 0 {
                    assert_ne!(x, row(), "{r:?}");
                }
                r.undo(&mut x, 8, pos);
                for (a, b) in x.iter().zip(row()) {
                    assert!((a - b).abs() < 1e-4, "{r:?} {pos}: {a} {b}");
                }
            }
        }
    }

    #[test]
    fn position_zero_and_unroped_dimensions_pass_unchanged() {
        let r = Rope::plain(4, 10000.0, true);
        let mut x = row();
        r.undo(&mut x, 8, 0);
        assert_eq!(x, row());
        r.undo(&mut x, 8, 5);
        // dims 4..8 of each 8-value head are not roped
        assert_eq!(x[4..8], row()[4..8]);
        assert_eq!(x[12..16], row()[12..16]);
        assert_ne!(x[0..4], row()[0..4]);
    }

    #[test]
    fn m_rope_of_a_text_cell_is_neox_and_heights_and_widths_turn_their_sections() {
        for imrope in [false, true] {
            let m = Rope {
                sections: [1, 1, 1, 0],
                imrope,
                ..Rope::plain(8, 10000.0, true)
            };
            let plain = Rope::plain(8, 10000.0, true);
            assert_eq!(m.cache(7), plain.cache(7));
            let at = m.cache_at([7.0, 3.0, 5.0, 7.0]);
            // pair 0: time; pair 1: height; pair 2: width; pair 3 (sector 0 again): time
            let theta = |p: f32, i: i32| p * 10000f32.powf(-2.0 * i as f32 / 8.0);
            let want = [theta(7.0, 0), theta(3.0, 1), theta(5.0, 2), theta(7.0, 3)];
            for (i, (c, _)) in at.iter().enumerate() {
                assert!((c - want[i].cos()).abs() < 1e-5, "{imrope} {i}");
            }
            let mut x = row();
            m.apply(&mut x, 8, 0); // position 0: identity
            assert_eq!(x, row());
        }
    }

    #[test]
    fn norm_turns_neighbours_by_pos_times_frequency() {
        // dimension pair 0 turns by pos (frequency 1): rope of (1, 0) at pos 1 is (cos 1, sin 1)
        let r = Rope::plain(4, 10000.0, false);
        let mut x = vec![1.0, 0.0, 1.0, 0.0];
        r.apply(&mut x, 4, 1);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
        // pair 1: frequency 10000^(-2/4) = 0.01
        assert!((x[2] - 0.01f32.cos()).abs() < 1e-6 && (x[3] - 0.01f32.sin()).abs() < 1e-6);
    }
}
