//! What the tiled kernel ([`super::tile`]) shares with the reductions: a cell as a stream and
//! cell, and the top cells of a query's weights.

/// A cell a query sees: (stream index among the cache's, cell).
pub type Seen = (u32, u32);

/// The indices of the `k` largest weights, largest first (ties: the earlier cell first).
pub fn top_k(w: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..w.len()).collect();
    let by = |a: &usize, b: &usize| w[*b].total_cmp(&w[*a]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k, by);
        idx.truncate(k);
    }
    idx.sort_unstable_by(by);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_top_cells_largest_first_the_earlier_of_a_tie_first() {
        assert_eq!(top_k(&[0.1, 0.5, 0.5, 0.2], 3), [1, 2, 3]);
        assert_eq!(top_k(&[0.1, 0.5], 5), [1, 0]);
    }
}
