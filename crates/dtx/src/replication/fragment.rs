//! Raft frames too large for one message on the wire, cut into fragments and put back together.
//!
//! A snapshot carries a log's whole applied state, which grows with the data (tens or hundreds
//! of MB), while an envelope on the wire holds at most `net::MAX_ENVELOPE_BYTES`. A frame over
//! [`RaftConfig::fragment_bytes`](super::raft_log::RaftConfig::fragment_bytes) therefore leaves
//! as fragments, each a frame of its own:
//!
//! `group id u32 | FRAGMENT_MARK u32 | message id u64 | CRC-32 of the frame u32 | part u32 |
//! parts u32 | bytes`
//!
//! (little endian; the mark stands where an ordinary frame has its body's length, which is never
//! that large). The receiver puts messages together in any order of arrival, a few at a time
//! per sender and group ([`MAX_ASSEMBLIES`]: fragments of consecutive messages may interleave
//! where the network reorders). When a newer message (a larger id: ids grow within a sender's
//! term, and a sender leads, so sends large messages, only in a term it has not led before: the
//! id's high half) finds no room, the oldest unfinished one goes, and fragments of messages
//! older than every one kept are dropped. Lost fragments are lost messages, which Raft recovers
//! from: the leader sends again. Messages are told apart by id and checksum together, so that
//! a replica restarted within a term, numbering from 0 again, never mixes its fragments with
//! late ones of its earlier life; the checksum is checked once the frame is whole.

use super::raft_log::{RaftLogError, ReplicaId, FRAME_HEADER_BYTES};
use std::collections::BTreeMap;

/// Stands in a fragment's header where an ordinary frame has its body's length.
const FRAGMENT_MARK: u32 = u32::MAX;
/// A fragment's header: the group id, the mark, the message id, the checksum, the part and the
/// parts.
pub const FRAGMENT_HEADER_BYTES: usize = FRAME_HEADER_BYTES + 20;
/// Messages in assembly at once per sender and group.
pub const MAX_ASSEMBLIES: usize = 4;

/// Whether `frame` is a fragment (else an ordinary frame, or malformed).
pub fn is_fragment(frame: &[u8]) -> bool {
    frame.get(4..8).is_some_and(|m| m == FRAGMENT_MARK.to_le_bytes())
}

/// `frame` cut into fragments of at most `fragment_bytes` of it each, as message `id`; a frame
/// that fits goes as it is.
pub fn split(frame: Vec<u8>, id: u64, fragment_bytes: usize) -> Vec<Vec<u8>> {
    if frame.len() <= fragment_bytes {
        return vec![frame];
    }
    let group = &frame[..4];
    let crc = crc32fast::hash(&frame);
    let parts = frame.len().div_ceil(fragment_bytes) as u32;
    frame
        .chunks(fragment_bytes)
        .enumerate()
        .map(|(part, bytes)| {
            let mut f = Vec::with_capacity(FRAGMENT_HEADER_BYTES + bytes.len());
            f.extend_from_slice(group);
            f.extend_from_slice(&FRAGMENT_MARK.to_le_bytes());
            f.extend_from_slice(&id.to_le_bytes());
            f.extend_from_slice(&crc.to_le_bytes());
            f.extend_from_slice(&(part as u32).to_le_bytes());
            f.extend_from_slice(&parts.to_le_bytes());
            f.extend_from_slice(bytes);
            f
        })
        .collect()
}

/// A message's id and the CRC-32 of its whole frame: what tells messages apart.
type MessageKey = (u64, u32);

/// One fragment, read.
struct Fragment<'a> {
    key: MessageKey,
    part: usize,
    parts: usize,
    bytes: &'a [u8],
}

/// One message being put back together.
struct Assembly {
    parts: Vec<Option<Vec<u8>>>,
    missing: usize,
}

/// The messages in assembly at one group, by sender and id.
pub struct Reassembly {
    fragment_bytes: usize,
    /// The most parts a message may have: the largest whole frame accepted, in fragments.
    max_parts: usize,
    /// Keyed by message id and checksum.
    by_sender: BTreeMap<ReplicaId, BTreeMap<MessageKey, Assembly>>,
}

fn malformed(what: String) -> RaftLogError {
    RaftLogError::Malformed(format!("fragment: {what}"))
}

impl Reassembly {
    pub fn new(fragment_bytes: usize, max_frame_bytes: usize) -> Reassembly {
        Reassembly { fragment_bytes, max_parts: max_frame_bytes.div_ceil(fragment_bytes), by_sender: BTreeMap::new() }
    }

    /// Takes one fragment from `sender`; the whole frame once its last missing part came.
    /// A malformed fragment is an error and changes nothing.
    pub fn add(&mut self, sender: ReplicaId, fragment: &[u8]) -> Result<Option<Vec<u8>>, RaftLogError> {
        let Fragment { key, part, parts, bytes } = self.parse(fragment)?;
        let open = self.by_sender.entry(sender).or_default();
        if let Some(a) = open.get(&key).filter(|a| a.parts.len() != parts) {
            return Err(malformed(format!("message {} announced {} parts, now {parts}", key.0, a.parts.len())));
        }
        if !open.contains_key(&key) {
            if open.len() >= MAX_ASSEMBLIES {
                let oldest = *open.keys().next().expect("full");
                if key < oldest {
                    return Ok(None); // A late fragment of a message newer ones replaced.
                }
                open.remove(&oldest);
            }
            open.insert(key, Assembly { parts: vec![None; parts], missing: parts });
        }
        let a = open.get_mut(&key).expect("inserted above");
        if a.parts[part].is_none() {
            a.parts[part] = Some(bytes.to_vec());
            a.missing -= 1;
        }
        if a.missing > 0 {
            return Ok(None);
        }
        let a = open.remove(&key).expect("assembled");
        let whole: Vec<u8> = a.parts.into_iter().flatten().flatten().collect();
        if crc32fast::hash(&whole) != key.1 {
            return Err(malformed(format!("message {} put together does not match its checksum", key.0)));
        }
        Ok(Some(whole))
    }

    fn parse<'a>(&self, f: &'a [u8]) -> Result<Fragment<'a>, RaftLogError> {
        if f.len() <= FRAGMENT_HEADER_BYTES || !is_fragment(f) {
            return Err(malformed(format!("{} bytes, no header and bytes", f.len())));
        }
        let u32_at = |at: usize| u32::from_le_bytes(f[at..at + 4].try_into().expect("4 bytes")) as usize;
        let id = u64::from_le_bytes(f[8..16].try_into().expect("8 bytes"));
        let (crc, part, parts) = (u32_at(16) as u32, u32_at(20), u32_at(24));
        let bytes = &f[FRAGMENT_HEADER_BYTES..];
        if parts < 2 || parts > self.max_parts || part >= parts {
            return Err(malformed(format!("part {part} of {parts} (at most {} parts)", self.max_parts)));
        }
        if bytes.len() > self.fragment_bytes {
            return Err(malformed(format!("{} bytes, over {}", bytes.len(), self.fragment_bytes)));
        }
        Ok(Fragment { key: (id, crc), part, parts, bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(len: usize) -> Vec<u8> {
        let mut f = 7u32.to_le_bytes().to_vec();
        f.extend_from_slice(&((len - FRAME_HEADER_BYTES) as u32).to_le_bytes());
        f.extend((0..len - FRAME_HEADER_BYTES).map(|i| i as u8));
        f
    }

    #[test]
    fn a_frame_comes_back_whole_in_any_order_with_duplicates() {
        let whole = frame(1000);
        let mut parts = split(whole.clone(), 5, 64);
        assert_eq!(parts.len(), 16);
        assert!(parts.iter().all(|p| is_fragment(p) && p.len() <= FRAGMENT_HEADER_BYTES + 64));
        parts.reverse();
        parts.insert(3, parts[0].clone());
        let mut r = Reassembly::new(64, 4096);
        let mut out = Vec::new();
        for p in &parts {
            out.extend(r.add(2, p).expect("well formed"));
        }
        assert_eq!(out, vec![whole]);
        assert_eq!(split(frame(64), 6, 64), vec![frame(64)], "a frame that fits goes as it is");
    }

    #[test]
    fn interleaved_messages_come_back_and_the_oldest_unfinished_goes_when_full() {
        let msgs: Vec<Vec<Vec<u8>>> = (0..=MAX_ASSEMBLIES as u64).map(|id| split(frame(300), id, 100)).collect();
        let reused_id = split(frame(290), 1, 100);
        let mut r = Reassembly::new(100, 4096);
        for m in &msgs[..MAX_ASSEMBLIES] {
            assert_eq!(r.add(1, &m[0]).unwrap(), None);
        }
        assert_eq!(r.add(1, &msgs[1][1]).unwrap(), None);
        assert_eq!(r.add(1, &reused_id[2]).unwrap(), None, "the same id, another message: kept apart");
        assert_eq!(r.add(1, &msgs[1][2]).unwrap(), Some(frame(300)), "interleaved, still whole");
        assert_eq!(r.add(1, &reused_id[0]).unwrap(), None);
        assert_eq!(r.add(1, &reused_id[1]).unwrap(), Some(frame(290)));
        assert_eq!(r.add(1, &msgs[MAX_ASSEMBLIES][0]).unwrap(), None, "fills the slot message 1 left");
        assert_eq!(r.add(2, &msgs[0][1]).unwrap(), None, "another sender has its own");
        let newest = split(frame(250), 9, 100);
        assert_eq!(r.add(1, &newest[0]).unwrap(), None, "full: message 0, the oldest, goes");
        assert_eq!(r.add(1, &msgs[0][1]).unwrap(), None, "older than every one kept: dropped");
        assert_eq!(r.add(1, &newest[1]).unwrap(), None);
        assert_eq!(r.add(1, &newest[2]).unwrap(), Some(frame(250)));
    }

    #[test]
    fn malformed_fragments_are_errors() {
        let mut r = Reassembly::new(100, 400);
        let good = split(frame(300), 1, 100);
        assert!(r.add(1, &good[0][..FRAGMENT_HEADER_BYTES]).is_err(), "no bytes");
        let mut too_many = good[0].clone();
        too_many[24..28].copy_from_slice(&9u32.to_le_bytes());
        assert!(r.add(1, &too_many).is_err(), "more parts than the largest frame needs");
        let mut past_end = good[0].clone();
        past_end[20..24].copy_from_slice(&3u32.to_le_bytes());
        assert!(r.add(1, &past_end).is_err(), "part beyond the parts");
        let mut big = good[0].clone();
        big.extend_from_slice(&[0; 10]);
        assert!(r.add(1, &big).is_err(), "over the fragment size");
        r.add(1, &good[0]).unwrap();
        let mut other_count = good[1].clone();
        other_count[24..28].copy_from_slice(&4u32.to_le_bytes());
        assert!(r.add(1, &other_count).is_err(), "parts changed within one message");
        let mut garbled = good[1].clone();
        garbled[FRAGMENT_HEADER_BYTES] ^= 1;
        r.add(1, &garbled).unwrap();
        assert!(r.add(1, &good[2]).is_err(), "a whole that does not match its checksum");
    }
}
