//! Detock: how a home tells a copy of a multi-home transaction's piece from a piece it has not
//! placed, exactly and in bounded memory.
//!
//! A coordinator numbers the pieces it sends each home region, from 1 ([`CoordinatorSeqs`]),
//! and logs the numbers with the transaction (`Record::Coordinated`), so that a restarted
//! coordinator sends a piece again under the number it had. It sends a piece until the home
//! holds it durably, so every number a coordinator hands a home reaches it at last. A home
//! therefore keeps, per coordinator, the number below which it holds every piece and the few
//! it holds above it ([`PlacedSeqs`]): a copy is any number at or below the first or among the
//! second, however long ago it was placed. (A set of the last 65,536 pieces placed, as before,
//! placed a copy again that came after that many newer pieces.)
//!
//! SLOG's orderer does the same with its per-region batch numbers (`Piece::region_batch`).

use crate::net::NodeId;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// A piece's number for each of its transaction's homes, as its coordinator logged it.
pub type HomeSeqs = Vec<(u16, u64)>;

/// A coordinator's last number per home region.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct CoordinatorSeqs {
    last: BTreeMap<u16, u64>,
}

impl CoordinatorSeqs {
    /// Numbers a logged transaction took: numbering goes on after them (a restart must not
    /// reuse one it sent: a piece is sent only once its `Coordinated` record is durable, so the
    /// log holds every number that left).
    pub fn note(&mut self, logged: &HomeSeqs) {
        for &(home, seq) in logged {
            let last = self.last.entry(home).or_default();
            *last = (*last).max(seq);
        }
    }

    /// The next number for each of `homes`.
    pub fn take(&mut self, homes: &[u16]) -> HomeSeqs {
        homes
            .iter()
            .map(|&h| {
                let last = self.last.entry(h).or_default();
                *last += 1;
                (h, *last)
            })
            .collect()
    }

    /// Hand back the numbers [`take`](Self::take) just gave (the log refused their record, so
    /// no piece under them was sent).
    pub fn give_back(&mut self, seqs: &HomeSeqs) {
        for &(home, seq) in seqs {
            let last = self.last.get_mut(&home).expect("a number taken for this home");
            assert_eq!(*last, seq, "only the numbers just taken are given back");
            *last -= 1;
        }
    }
}

/// The numbers a home (one sequencer) placed, per coordinator.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct PlacedSeqs {
    by_coordinator: FxHashMap<NodeId, Window>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Window {
    /// Every number up to this one is placed.
    through: u64,
    /// Numbers placed above `through + 1`: pieces that overtook an earlier one still on its
    /// way (at most the coordinator's pieces in flight).
    above: BTreeSet<u64>,
}

impl PlacedSeqs {
    /// Note coordinator `from`'s piece `seq` as placed; false if it was already.
    pub fn first(&mut self, from: NodeId, seq: u64) -> bool {
        assert!(seq > 0, "pieces are numbered from 1");
        let w = self.by_coordinator.entry(from).or_default();
        if seq <= w.through || !w.above.insert(seq) {
            return false;
        }
        while w.above.first() == Some(&(w.through + 1)) {
            w.above.pop_first();
            w.through += 1;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl CoordinatorSeqs {
        fn after<'a>(logged: impl IntoIterator<Item = &'a HomeSeqs>) -> Self {
            let mut s = CoordinatorSeqs::default();
            logged.into_iter().for_each(|seqs| s.note(seqs));
            s
        }
    }

    impl PlacedSeqs {
        /// Numbers held above the unbroken runs, over every coordinator (what this costs).
        fn held_above(&self) -> usize {
            self.by_coordinator.values().map(|w| w.above.len()).sum()
        }
    }

    #[test]
    fn a_copy_is_known_however_many_pieces_came_after_it() {
        let mut placed = PlacedSeqs::default();
        for seq in 1..=200_000 {
            assert!(placed.first(3, seq));
        }
        assert!(!placed.first(3, 1), "the first piece's copy, 199,999 pieces later");
        assert!(!placed.first(3, 200_000));
        assert!(placed.first(4, 1), "another coordinator numbers on its own");
        assert_eq!(placed.held_above(), 0, "an unbroken run costs one number");
    }

    #[test]
    fn pieces_out_of_order_are_held_until_the_run_closes() {
        let mut placed = PlacedSeqs::default();
        assert!(placed.first(1, 3));
        assert!(placed.first(1, 2));
        assert!(!placed.first(1, 3), "a copy above the run");
        assert_eq!(placed.held_above(), 2);
        assert!(placed.first(1, 1));
        assert_eq!(placed.held_above(), 0, "1..=3 is one run now");
        assert!(!placed.first(1, 2));
        assert!(placed.first(1, 4));
    }

    #[test]
    fn a_coordinator_numbers_each_home_and_goes_on_after_its_log() {
        let mut seqs = CoordinatorSeqs::default();
        assert_eq!(seqs.take(&[0, 2]), vec![(0, 1), (2, 1)]);
        let second = seqs.take(&[2]);
        assert_eq!(second, vec![(2, 2)]);
        seqs.give_back(&second);
        assert_eq!(seqs.take(&[2, 1]), vec![(2, 2), (1, 1)], "a refused record's numbers are used again");
        let logged = [vec![(0, 1), (2, 1)], vec![(2, 7)]];
        let mut restarted = CoordinatorSeqs::after(logged.iter());
        assert_eq!(restarted.take(&[0, 2, 1]), vec![(0, 2), (2, 8), (1, 1)]);
    }
}
