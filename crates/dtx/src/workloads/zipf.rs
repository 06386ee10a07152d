//! Zipf-distributed ranks over `0..n` for any theta ≥ 0 (theta = 0 is uniform; 0.99 is YCSB's
//! hot skew; values above 1 are allowed). The CDF is tabulated once, then each draw is a search
//! of it: exact for every theta, unlike the closed form YCSB uses, which breaks down at theta = 1.
//!
//! The search starts from a guide table (Chen and Asau's indexed search): for each of `n` equal
//! slices of the unit interval, the first rank whose CDF reaches the slice, so that a draw
//! searches only the few ranks its slice spans. A plain binary search of a 200k-key table was 16%
//! of a `local` Calvin run's CPU (a perf profile, YCSB θ 0.9): about 18 dependent loads a draw,
//! most of them cache misses. The guide changes no draw: its answer is checked against the CDF
//! and falls back to the whole search if a rounding put it off (never seen; the test compares).

use rand::Rng as _;

pub struct Zipf {
    n: u64,
    cdf: Vec<f64>,
    /// `guide[j]`: the first rank whose CDF is at least `j / (guide.len() - 1)`.
    guide: Vec<u32>,
}

impl Zipf {
    pub fn new(n: u64, theta: f64) -> anyhow::Result<Self> {
        if n == 0 {
            anyhow::bail!("a key range must hold at least one key");
        }
        if !(theta.is_finite() && theta >= 0.0) {
            anyhow::bail!("zipf theta {theta} must be a finite number ≥ 0");
        }
        if theta == 0.0 {
            return Ok(Zipf { n, cdf: Vec::new(), guide: Vec::new() });
        }
        if n > 50_000_000 {
            anyhow::bail!("zipf over {n} keys is beyond the 50M-key table limit");
        }
        let mut cdf = Vec::with_capacity(n as usize);
        let mut sum = 0.0;
        for i in 1..=n {
            sum += 1.0 / (i as f64).powf(theta);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        let guide = guide_table(&cdf, cdf.len());
        Ok(Zipf { n, cdf, guide })
    }

    #[inline]
    pub fn sample(&self, rng: &mut crate::util::Rng) -> u64 {
        if self.cdf.is_empty() {
            return rng.gen_range(0..self.n);
        }
        let u: f64 = rng.gen();
        (self.rank_at(u) as u64).min(self.n - 1)
    }

    /// The first rank whose CDF is at least `u`: `cdf.partition_point(|&c| c < u)`, searched
    /// from `u`'s slice of the guide table.
    #[inline]
    fn rank_at(&self, u: f64) -> usize {
        let slices = self.guide.len() - 1;
        let j = ((u * slices as f64) as usize).min(slices - 1);
        let (lo, hi) = (self.guide[j] as usize, self.guide[j + 1] as usize);
        let r = lo + self.cdf[lo..hi.min(self.cdf.len())].partition_point(|&c| c < u);
        let is_first_at_least_u = (r == 0 || self.cdf[r - 1] < u) && (r == self.cdf.len() || self.cdf[r] >= u);
        if is_first_at_least_u {
            r
        } else {
            self.cdf.partition_point(|&c| c < u)
        }
    }
}

/// The guide of `cdf` over `slices` equal slices of the unit interval: entry `j` (of
/// `slices + 1`) is the first rank whose CDF is at least `j / slices`, found in one pass.
fn guide_table(cdf: &[f64], slices: usize) -> Vec<u32> {
    assert!(cdf.len() <= u32::MAX as usize && slices > 0, "a guide of {} ranks in {slices} slices", cdf.len());
    let mut guide = Vec::with_capacity(slices + 1);
    let mut rank = 0;
    for j in 0..=slices {
        let at = j as f64 / slices as f64;
        while rank < cdf.len() && cdf[rank] < at {
            rank += 1;
        }
        guide.push(rank as u32);
    }
    guide
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skew_concentrates_on_low_ranks() {
        let mut rng = crate::util::rng_from_seed(3);
        let z = Zipf::new(1000, 0.99).unwrap();
        let hot = (0..10_000).filter(|_| z.sample(&mut rng) < 10).count();
        assert!(hot > 3000, "theta 0.99 should put >30% of draws on the top 1%: {hot}");
        let u = Zipf::new(1000, 0.0).unwrap();
        let hot = (0..10_000).filter(|_| u.sample(&mut rng) < 10).count();
        assert!(hot < 300);
        let z2 = Zipf::new(1000, 1.5).unwrap();
        assert!((0..1000).all(|_| z2.sample(&mut rng) < 1000));
        assert!(Zipf::new(10, -1.0).is_err());
    }

    /// The guide table changes no draw: every rank is the binary search's, for draws spread
    /// over the interval, the slices' own edges and the CDF's own values (where a draw sits
    /// exactly on a boundary), at several skews and sizes.
    #[test]
    fn the_guided_search_finds_the_binary_searchs_rank() {
        let mut rng = crate::util::rng_from_seed(11);
        for (n, theta) in [(1, 0.9), (2, 0.5), (1000, 0.99), (20_000, 0.9), (50_000, 1.5), (7, 3.0)] {
            let z = Zipf::new(n, theta).unwrap();
            let slices = z.guide.len() - 1;
            let edges = (0..slices).map(|j| j as f64 / slices as f64);
            let on_cdf = z.cdf.iter().copied().filter(|&c| c < 1.0);
            let draws = (0..20_000).map(|_| rng.gen::<f64>());
            for u in edges.chain(on_cdf).chain(draws) {
                assert_eq!(z.rank_at(u), z.cdf.partition_point(|&c| c < u), "n {n} theta {theta} u {u}");
            }
        }
    }
}
