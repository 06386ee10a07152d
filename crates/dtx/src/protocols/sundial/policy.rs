//! When a cached copy of a remote tuple is used (Sec. 4.2): always (`reuse`), never without
//! asking its home whether it is current (`request`, which saves the data's bytes when it is),
//! or as the votes of recent evidence say (`hybrid`, the paper's default).

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CachePolicy {
    /// No cache: every remote read asks the home for the data.
    None,
    /// Every hit is used as it is; a stale copy shows up at prepare, when its lease cannot be
    /// extended.
    Reuse,
    /// A hit still asks the home, sending the cached version; the home answers with the lease
    /// alone when the version is current, else with the data.
    Request,
    /// `reuse` while cached copies keep proving current, `request` otherwise.
    Hybrid,
}

impl CachePolicy {
    /// The option value (`cache=none|reuse|request|hybrid`).
    pub fn parse(s: &str) -> Result<CachePolicy, String> {
        match s {
            "none" => Ok(CachePolicy::None),
            "reuse" => Ok(CachePolicy::Reuse),
            "request" => Ok(CachePolicy::Request),
            "hybrid" => Ok(CachePolicy::Hybrid),
            other => Err(format!("cache: unknown policy `{other}` (use none, reuse, request or hybrid)")),
        }
    }
}

/// The share of votes for the cache above which `hybrid` reuses (the paper: "we found 0.8 to be
/// a good threshold").
pub const REUSE_THRESHOLD: f64 = 0.8;
/// Votes are halved whenever their total reaches this, so that old evidence fades (the
/// authors' code; the paper gives no decay).
pub const DECAY_AT_VOTES: u64 = 100_000;

/// A server's two vote counters: `for_cache` counts a remote check that found the cached copy
/// current and a cached read whose lease was extended; `for_remote` a check that found a newer
/// version and a cached read whose extension failed.
#[derive(Debug, Default)]
pub struct Votes {
    for_cache: AtomicU64,
    for_remote: AtomicU64,
}

impl Votes {
    pub fn cache_was_current(&self) {
        self.for_cache.fetch_add(1, Ordering::Relaxed);
        self.decay();
    }

    pub fn cache_was_stale(&self) {
        self.for_remote.fetch_add(1, Ordering::Relaxed);
        self.decay();
    }

    fn decay(&self) {
        let (c, r) = (self.for_cache.load(Ordering::Relaxed), self.for_remote.load(Ordering::Relaxed));
        if c + r >= DECAY_AT_VOTES {
            // Racing halvings only fade the evidence faster; the counters stay consistent enough
            // for a heuristic.
            self.for_cache.store(c / 2, Ordering::Relaxed);
            self.for_remote.store(r / 2, Ordering::Relaxed);
        }
    }

    /// Whether a hit is used without asking its home, under `policy`. With no votes yet,
    /// `hybrid` reuses (a cache with no evidence against it).
    pub fn reuse(&self, policy: CachePolicy) -> bool {
        match policy {
            CachePolicy::None | CachePolicy::Request => false,
            CachePolicy::Reuse => true,
            CachePolicy::Hybrid => {
                let (c, r) = (self.for_cache.load(Ordering::Relaxed), self.for_remote.load(Ordering::Relaxed));
                c + r == 0 || c as f64 / (c + r) as f64 > REUSE_THRESHOLD
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hybrid_follows_the_votes_across_the_threshold() {
        let v = Votes::default();
        assert!(v.reuse(CachePolicy::Hybrid), "no evidence yet");
        for _ in 0..8 {
            v.cache_was_current();
        }
        for _ in 0..2 {
            v.cache_was_stale();
        }
        assert!(!v.reuse(CachePolicy::Hybrid), "0.8 exactly is not above the threshold");
        v.cache_was_current();
        assert!(v.reuse(CachePolicy::Hybrid), "9 of 11");
        assert!(v.reuse(CachePolicy::Reuse) && !v.reuse(CachePolicy::Request) && !v.reuse(CachePolicy::None));
    }

    #[test]
    fn votes_decay_so_that_a_change_of_workload_shows() {
        let v = Votes::default();
        for _ in 0..DECAY_AT_VOTES - 1 {
            v.cache_was_current();
        }
        v.cache_was_stale();
        let total = v.for_cache.load(Ordering::Relaxed) + v.for_remote.load(Ordering::Relaxed);
        assert!(total <= DECAY_AT_VOTES / 2, "halved at the bound: {total}");
        // Writes start: after the decay, a few tens of thousands of stale checks flip it.
        for _ in 0..20_000 {
            v.cache_was_stale();
        }
        assert!(!v.reuse(CachePolicy::Hybrid));
    }

    #[test]
    fn policies_parse_and_an_unknown_one_is_named() {
        assert_eq!(CachePolicy::parse("hybrid"), Ok(CachePolicy::Hybrid));
        assert!(CachePolicy::parse("sometimes").unwrap_err().contains("unknown policy `sometimes`"));
    }
}
