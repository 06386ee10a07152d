//! The order across a node's log lanes: what a record in a lane looks like, and what a node's
//! lanes amount to after a crash.
//!
//! A node's log on a disk (a real WAL, or the simulator's) is split into lanes, one per worker
//! (Silo's and Rolis's per-worker logs), so that workers append without sharing a buffer or a
//! lock. Each lane is a log of its own with its own group commit. What keeps the lanes one log
//! is a node-wide **sequence number**: every record takes the next one when it is appended
//! (before the locks it describes are released, so two conflicting writes are in install order
//! by sequence number), and the node's durable point is the largest sequence number below
//! which every record of every lane is durable ([`super::log::NodeLog::durable_lsn`]). A record
//! is acknowledged only once it is below that point, so whatever an acknowledged transaction
//! read or overwrote is durable with it.
//!
//! After a crash, a lane may hold durable records past a sequence number that another lane
//! lost (it flushed first). Such **orphans** were never acknowledged and may depend on the lost
//! record, so recovery ([`merge`]) replays only the unbroken run of sequence numbers, and the
//! next boot appends a **void** record naming the orphans' range, so that later recoveries
//! step over it instead of stopping there again.
//!
//! A lane record is a kind byte, the sequence number (u64, little endian), then the body: the
//! protocol's record for [`KIND_RECORD`], the void range `from..=to` (two u64) for
//! [`KIND_VOID`].

use std::collections::BTreeMap;

pub const LANE_HEADER_BYTES: usize = 9;
pub const KIND_RECORD: u8 = 1;
pub const KIND_VOID: u8 = 2;

/// The header of a lane record.
pub fn header(kind: u8, seq: u64) -> [u8; LANE_HEADER_BYTES] {
    let mut h = [0u8; LANE_HEADER_BYTES];
    h[0] = kind;
    h[1..].copy_from_slice(&seq.to_le_bytes());
    h
}

/// The body of a void record for the sequence numbers `from..=to`.
pub fn void_body(from: u64, to: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&from.to_le_bytes());
    b[8..].copy_from_slice(&to.to_le_bytes());
    b
}

/// A lane record as read back.
#[derive(Debug, PartialEq, Eq)]
pub enum LaneRecord<'a> {
    Record { seq: u64, body: &'a [u8] },
    Void { seq: u64, from: u64, to: u64 },
}

impl LaneRecord<'_> {
    pub fn seq(&self) -> u64 {
        match self {
            LaneRecord::Record { seq, .. } | LaneRecord::Void { seq, .. } => *seq,
        }
    }
}

pub fn decode(bytes: &[u8]) -> Result<LaneRecord<'_>, String> {
    if bytes.len() < LANE_HEADER_BYTES {
        return Err(format!("a lane record of {} bytes is shorter than its header", bytes.len()));
    }
    let seq = u64::from_le_bytes(bytes[1..LANE_HEADER_BYTES].try_into().expect("8 bytes"));
    let body = &bytes[LANE_HEADER_BYTES..];
    match bytes[0] {
        KIND_RECORD => Ok(LaneRecord::Record { seq, body }),
        KIND_VOID if body.len() == 16 => {
            let from = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
            let to = u64::from_le_bytes(body[8..].try_into().expect("8 bytes"));
            Ok(LaneRecord::Void { seq, from, to })
        }
        kind => Err(format!("a lane record of kind {kind} and {} bytes is neither a record nor a void", bytes.len())),
    }
}

/// What a node's lanes amount to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Merged {
    /// The protocol's records of the unbroken run of sequence numbers after the checkpoint, in
    /// sequence order.
    pub records: Vec<Vec<u8>>,
    /// The last sequence number of that run (the checkpoint's when the run is empty).
    pub last_seq: u64,
    /// The largest sequence number any lane holds (orphans included).
    pub max_seq: u64,
}

impl Merged {
    /// The orphans' range, which the next boot must void before it appends anything else.
    pub fn orphans(&self) -> Option<(u64, u64)> {
        (self.max_seq > self.last_seq).then_some((self.last_seq + 1, self.max_seq))
    }

    /// How many sequence numbers the orphans' range spans.
    pub fn orphan_count(&self) -> u64 {
        self.max_seq - self.last_seq
    }
}

/// A WAL's records (WAL order) as the lanes' runs [`merge`] takes: a cut writes each lane's
/// records in a run, in sequence order, one lane after another, so a new run starts wherever the
/// sequence number does not increase. (Which lane a run came from does not matter to the merge.)
pub fn runs(records: &[Vec<u8>]) -> Vec<Vec<&[u8]>> {
    let mut runs: Vec<Vec<&[u8]>> = Vec::new();
    let mut previous = u64::MAX;
    for r in records {
        let seq = decode(r).map_or(0, |d| d.seq());
        if seq <= previous || runs.is_empty() {
            runs.push(Vec::new());
        }
        previous = seq;
        runs.last_mut().expect("a run").push(r.as_slice());
    }
    runs
}

/// Merge the lanes' records (each lane oldest first) after a checkpoint that covers every
/// sequence number up to `after`. Fails on a record that does not decode or a lane whose
/// sequence numbers do not increase: a foreign or corrupt log, which recovery must not guess at.
pub fn merge<'a, L, R>(lanes: L, after: u64) -> Result<Merged, String>
where
    L: IntoIterator<Item = R>,
    R: IntoIterator<Item = &'a [u8]>,
{
    let mut bodies: BTreeMap<u64, &[u8]> = BTreeMap::new();
    // Sequence numbers that are not records but count as present: void records themselves, and
    // the ranges they void (from -> to).
    let mut void_at: BTreeMap<u64, ()> = BTreeMap::new();
    let mut voided: BTreeMap<u64, u64> = BTreeMap::new();
    let mut max_seq = after;
    for (lane, records) in lanes.into_iter().enumerate() {
        let mut previous = 0u64;
        for bytes in records {
            let r = decode(bytes).map_err(|e| format!("lane {lane}: {e}"))?;
            let seq = r.seq();
            if seq <= previous {
                return Err(format!("lane {lane}: sequence number {seq} follows {previous}"));
            }
            previous = seq;
            max_seq = max_seq.max(seq);
            match r {
                LaneRecord::Record { body, .. } if seq > after => {
                    if bodies.insert(seq, body).is_some() {
                        return Err(format!("lane {lane}: sequence number {seq} is in the log twice"));
                    }
                }
                LaneRecord::Record { .. } => {}
                LaneRecord::Void { from, to, .. } => {
                    void_at.insert(seq, ());
                    voided.insert(from, to);
                }
            }
        }
    }
    let mut records = Vec::with_capacity(bodies.len());
    let mut next = after + 1;
    loop {
        if let Some((_, &to)) = voided.range(..=next).next_back().filter(|(_, &to)| to >= next) {
            next = to + 1;
        } else if void_at.contains_key(&next) {
            next += 1;
        } else if let Some(body) = bodies.get(&next) {
            records.push(body.to_vec());
            next += 1;
        } else {
            break;
        }
    }
    Ok(Merged { records, last_seq: next - 1, max_seq })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64, body: &[u8]) -> Vec<u8> {
        [&header(KIND_RECORD, seq)[..], body].concat()
    }

    fn void(seq: u64, from: u64, to: u64) -> Vec<u8> {
        [&header(KIND_VOID, seq)[..], &void_body(from, to)[..]].concat()
    }

    fn run(lanes: &[Vec<Vec<u8>>], after: u64) -> Merged {
        merge(lanes.iter().map(|l| l.iter().map(|r| r.as_slice())), after).expect("merges")
    }

    #[test]
    fn lanes_interleave_by_sequence_number() {
        let lanes = vec![vec![rec(1, b"a"), rec(3, b"c")], vec![rec(2, b"b"), rec(4, b"d")]];
        let m = run(&lanes, 0);
        assert_eq!(m.records, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]);
        assert_eq!((m.last_seq, m.max_seq, m.orphans()), (4, 4, None));
    }

    #[test]
    fn a_lost_record_ends_the_run_and_orphans_what_follows() {
        // Lane 1 lost 3 (not flushed); lane 0 flushed 4 and 5, which may depend on it.
        let lanes = vec![vec![rec(1, b"a"), rec(4, b"d"), rec(5, b"e")], vec![rec(2, b"b")]];
        let m = run(&lanes, 0);
        assert_eq!(m.records, vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!((m.last_seq, m.orphans()), (2, Some((3, 5))));
    }

    #[test]
    fn a_void_record_steps_over_the_orphans_of_an_earlier_boot() {
        // Boot 2 voided 3..=5 at seq 6, then appended 7 and 8.
        let lanes = vec![
            vec![rec(1, b"a"), rec(4, b"d"), rec(5, b"e"), void(6, 3, 5), rec(8, b"h")],
            vec![rec(2, b"b"), rec(7, b"g")],
        ];
        let m = run(&lanes, 0);
        assert_eq!(m.records, vec![b"a".to_vec(), b"b".to_vec(), b"g".to_vec(), b"h".to_vec()]);
        assert_eq!((m.last_seq, m.orphans()), (8, None));
    }

    #[test]
    fn a_void_lost_with_its_boot_voids_nothing() {
        // Boot 2's void (seq 6) never became durable: the run still stops at 3.
        let lanes = vec![vec![rec(1, b"a"), rec(4, b"d")], vec![rec(2, b"b"), rec(7, b"g")]];
        let m = run(&lanes, 0);
        assert_eq!((m.records.len(), m.last_seq, m.orphans()), (2, 2, Some((3, 7))));
    }

    #[test]
    fn records_a_checkpoint_covers_are_skipped() {
        let lanes = vec![vec![rec(1, b"a"), rec(3, b"c")], vec![rec(2, b"b"), rec(4, b"d")]];
        let m = run(&lanes, 2);
        assert_eq!(m.records, vec![b"c".to_vec(), b"d".to_vec()]);
        assert_eq!(run(&[vec![], vec![]], 9), Merged { records: vec![], last_seq: 9, max_seq: 9 });
    }

    #[test]
    fn one_file_of_cuts_splits_into_runs_that_merge() {
        // Two cuts of two lanes: lane 0 then lane 1 in each; the second cut lost lane 1's tail.
        let file = vec![rec(1, b"a"), rec(3, b"c"), rec(2, b"b"), rec(4, b"d"), rec(6, b"f"), rec(5, b"e")];
        let runs = runs(&file);
        assert_eq!(runs.len(), 3, "a run starts where the number does not increase");
        let m = merge(runs, 0).expect("merges");
        assert_eq!(m.records.len(), 6);
        let torn = vec![rec(1, b"a"), rec(2, b"b"), rec(4, b"d"), rec(3, b"c")];
        let m = merge(runs_of(&torn), 0).expect("merges");
        assert_eq!((m.last_seq, m.orphans()), (4, None));
        let twice = vec![rec(1, b"a"), rec(1, b"a")];
        assert!(merge(runs_of(&twice), 0).unwrap_err().contains("twice"));
    }

    fn runs_of(file: &[Vec<u8>]) -> Vec<Vec<&[u8]>> {
        runs(file)
    }

    #[test]
    fn garbage_and_disorder_are_refused() {
        let bad = [vec![vec![7u8, 0, 0]]];
        assert!(merge(bad.iter().map(|l| l.iter().map(|r| r.as_slice())), 0).is_err());
        let disorder = [vec![rec(2, b"b"), rec(1, b"a")]];
        let e = merge(disorder.iter().map(|l| l.iter().map(|r| r.as_slice())), 0).unwrap_err();
        assert!(e.contains("sequence number 1 follows 2"), "{e}");
    }
}
