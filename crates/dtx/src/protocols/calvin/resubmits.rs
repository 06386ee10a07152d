//! The submissions a sequencer (or SLOG's orderer) took lately, so that a copy of one reaching
//! a later incarnation of its node is dropped, not sequenced a second time.
//!
//! A client's submission is one RPC, resent by the RPC layer on a lossy network until answered,
//! and the RPC layer drops the copies, but only within the incarnation that took the first:
//! once a node's sequencer crashes (or its node fails over to a replica of its log) after
//! logging a batch with the submission, a copy still on its way, or resent because the answer
//! was lost, reaches a sequencer that has no memory of it, and the transaction would run twice
//! (a duplicate append in the checker's terms). So every sequencer remembers what it took for as
//! long as a copy can come, the RPC layer's own horizon (twice its timeout: the client stops
//! resending at the timeout), and a restarted one starts by remembering everything its log
//! holds from before, for that long again.

use crate::net::Addr;
use rustc_hash::FxHashSet;
use std::collections::VecDeque;

/// At most this many submissions are remembered; past it the oldest are forgotten early (only a
/// copy arriving after that many newer submissions within the horizon could then run twice).
const MAX_REMEMBERED: usize = 1 << 20;

/// A submission: its client and the client's number for it.
pub type Submission = (Addr, u64);

pub struct RecentSubmissions {
    seen: FxHashSet<Submission>,
    /// When each was first seen, µs, oldest first.
    order: VecDeque<(u64, Submission)>,
    horizon_us: u64,
}

impl RecentSubmissions {
    /// Remember submissions for `horizon_us` after they are seen, starting with `logged` (what
    /// the node's log held at start), seen at `now_us`.
    pub fn new(horizon_us: u64, now_us: u64, logged: impl IntoIterator<Item = Submission>) -> Self {
        let mut r = RecentSubmissions { seen: FxHashSet::default(), order: VecDeque::new(), horizon_us };
        for s in logged {
            r.first(now_us, s);
        }
        r
    }

    /// The submissions remembered, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = Submission> + '_ {
        self.order.iter().map(|(_, s)| *s)
    }

    /// True the first time `s` is seen within the horizon (and remembers it), false for a copy.
    pub fn first(&mut self, now_us: u64, s: Submission) -> bool {
        while let Some(&(at_us, old)) = self.order.front() {
            if now_us.saturating_sub(at_us) <= self.horizon_us && self.order.len() < MAX_REMEMBERED {
                break;
            }
            self.order.pop_front();
            self.seen.remove(&old);
        }
        if !self.seen.insert(s) {
            return false;
        }
        self.order.push_back((now_us, s));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_dropped_within_the_horizon_and_taken_after_it() {
        let client = Addr::new(1, 2);
        let mut r = RecentSubmissions::new(1_000, 0, [(client, 7)]);
        assert!(!r.first(10, (client, 7)), "what the log held before a restart is remembered");
        assert!(r.first(20, (client, 8)));
        assert!(!r.first(900, (client, 8)), "a copy within the horizon");
        assert!(r.first(1_010, (client, 9)), "forgetting runs as time passes");
        assert!(!r.seen.contains(&(client, 7)), "7 was seen at 0: forgotten after 1,000 µs");
        assert!(r.seen.contains(&(client, 8)), "8 was seen at 20: kept until 1,020 µs");
    }
}
