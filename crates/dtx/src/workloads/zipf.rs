//! Zipf-distributed ranks over `0..n` for any theta ≥ 0 (theta = 0 is uniform; 0.99 is YCSB's
//! hot skew; values above 1 are allowed). The CDF is tabulated once, then each draw is a binary
//! search: exact for every theta, unlike the closed form YCSB uses, which breaks down at theta = 1.

use rand::Rng as _;

pub struct Zipf {
    n: u64,
    cdf: Vec<f64>,
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
            return Ok(Zipf { n, cdf: Vec::new() });
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
        Ok(Zipf { n, cdf })
    }

    #[inline]
    pub fn sample(&self, rng: &mut crate::util::Rng) -> u64 {
        if self.cdf.is_empty() {
            return rng.gen_range(0..self.n);
        }
        let u: f64 = rng.gen();
        (self.cdf.partition_point(|&c| c < u) as u64).min(self.n - 1)
    }
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
}
