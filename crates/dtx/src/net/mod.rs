//! Messages between workers: addresses, the envelope every message travels in, per-destination
//! batching, and the latency/fault model the runtimes apply. Nothing here knows about protocols:
//! a protocol's message is an opaque body that the protocol encodes with [`encode`].

pub mod latency;

pub use latency::{FaultPlan, FaultTarget, LatencyModel, TargetedFault, TargetedKind};

use serde::{de::DeserializeOwned, Serialize};

pub type NodeId = u16;
pub type WorkerId = u16;

/// A worker on a node: the unit that sends and receives messages (one thread in `local`/`tcp`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Addr {
    pub node: NodeId,
    pub worker: WorkerId,
}

impl Addr {
    pub const fn new(node: NodeId, worker: WorkerId) -> Self {
        Addr { node, worker }
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "n{}w{}", self.node, self.worker)
    }
}

/// Largest encoded envelope we accept; anything larger is a protocol bug or a hostile peer.
pub const MAX_ENVELOPE_BYTES: usize = 4 << 20;
/// Largest batch frame on a TCP connection.
pub const MAX_FRAME_BYTES: usize = 16 << 20;
/// A batch grows past this only by its first envelope: the next one to the same destination
/// starts another, so that a burst (a snapshot's fragments) never makes a frame over
/// [`MAX_FRAME_BYTES`].
pub const MAX_BATCH_BYTES: usize = MAX_FRAME_BYTES - MAX_ENVELOPE_BYTES - 16;

/// What an envelope carries.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A request that expects a reply carrying the same rpc id.
    Request = 1,
    /// The reply to a request.
    Reply = 2,
    /// A message that expects no reply.
    OneWay = 3,
    /// A message for the node's own services (log replication), not for the protocol.
    Service = 4,
}

/// A decoded envelope, borrowing its body from the packet.
#[derive(Debug)]
pub struct Envelope<'a> {
    pub kind: Kind,
    pub rpc_id: u64,
    pub body: &'a [u8],
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DecodeError {
    #[error("truncated envelope")]
    Truncated,
    #[error("unknown envelope kind {0}")]
    BadKind(u8),
    #[error("envelope of {0} bytes exceeds the limit of {MAX_ENVELOPE_BYTES}")]
    TooLarge(usize),
}

/// A batch of envelopes from one worker to another: `[varint len][kind u8][rpc_id u64 le][body]...`.
/// Built by appending envelopes; sent as one unit by every runtime.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    pub buf: Vec<u8>,
    pub count: u32,
    /// It carries control messages only ([`Packet::control`]).
    pub control: bool,
}

impl Batch {
    pub fn push(&mut self, kind: Kind, rpc_id: u64, body: &[u8]) {
        let len = 9 + body.len();
        debug_assert!(len <= MAX_ENVELOPE_BYTES, "envelope too large: {len}");
        write_varint(&mut self.buf, len as u64);
        self.buf.push(kind as u8);
        self.buf.extend_from_slice(&rpc_id.to_le_bytes());
        self.buf.extend_from_slice(body);
        self.count += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// Iterate the envelopes of a batch buffer. Stops with an error on malformed input.
pub fn for_each_envelope(mut buf: &[u8], mut f: impl FnMut(Envelope<'_>)) -> Result<(), DecodeError> {
    while !buf.is_empty() {
        let (len, used) = read_varint(buf).ok_or(DecodeError::Truncated)?;
        let len = len as usize;
        if len > MAX_ENVELOPE_BYTES {
            return Err(DecodeError::TooLarge(len));
        }
        buf = &buf[used..];
        if len < 9 || buf.len() < len {
            return Err(DecodeError::Truncated);
        }
        let kind = match buf[0] {
            1 => Kind::Request,
            2 => Kind::Reply,
            3 => Kind::OneWay,
            4 => Kind::Service,
            k => return Err(DecodeError::BadKind(k)),
        };
        let mut id = [0u8; 8];
        id.copy_from_slice(&buf[1..9]);
        f(Envelope { kind, rpc_id: u64::from_le_bytes(id), body: &buf[9..len] });
        buf = &buf[len..];
    }
    Ok(())
}

/// A batch in flight between two workers.
#[derive(Debug, Clone)]
pub struct Packet {
    pub src: Addr,
    pub dst: Addr,
    pub bytes: Vec<u8>,
    /// Only control messages (group commit's watermarks and epochs), never batched with the
    /// rest, so that a fault can delay them alone (`--fault-at delay:...,messages=control`).
    /// Known where it is sent; not carried over the wire.
    pub control: bool,
}

pub fn write_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub fn read_varint(buf: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, b) in buf.iter().enumerate().take(10) {
        v |= ((b & 0x7f) as u64) << (7 * i);
        if b & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// Encode a protocol message body.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // Serialization of our own in-memory types cannot fail (no maps with non-string keys, no io).
    postcard::to_stdvec(msg).expect("postcard encoding of an in-memory message")
}

/// Decode a protocol message body; a malformed body from a peer is an error, never a panic.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, postcard::Error> {
    postcard::from_bytes(body)
}

/// Message counters kept per worker.
#[derive(Debug, Default, Clone, Copy)]
pub struct NetStats {
    pub msgs_sent: u64,
    pub bytes_sent: u64,
    pub packets_sent: u64,
    pub malformed: u64,
    /// Commit decisions that waited for the log, and how long in all (the durability share
    /// of commit latency; counted here because it is a per-worker counter like the others).
    pub log_waits: u64,
    pub log_wait_ns: u64,
}

impl NetStats {
    pub fn add(&mut self, o: &NetStats) {
        self.msgs_sent += o.msgs_sent;
        self.bytes_sent += o.bytes_sent;
        self.packets_sent += o.packets_sent;
        self.malformed += o.malformed;
        self.log_waits += o.log_waits;
        self.log_wait_ns += o.log_wait_ns;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_round_trip() {
        let mut b = Batch::default();
        b.push(Kind::Request, 7, b"hello");
        b.push(Kind::Reply, u64::MAX, b"");
        b.push(Kind::OneWay, 0, &vec![9u8; 300]);
        let mut seen = vec![];
        for_each_envelope(&b.buf, |e| seen.push((e.kind, e.rpc_id, e.body.len()))).unwrap();
        assert_eq!(seen, vec![(Kind::Request, 7, 5), (Kind::Reply, u64::MAX, 0), (Kind::OneWay, 0, 300)]);
    }

    #[test]
    fn malformed_batches_are_errors() {
        let mut b = Batch::default();
        b.push(Kind::Request, 1, b"abc");
        let cut = &b.buf[..b.buf.len() - 1];
        assert_eq!(for_each_envelope(cut, |_| {}), Err(DecodeError::Truncated));
        let mut bad = b.buf.clone();
        bad[1] = 77;
        assert_eq!(for_each_envelope(&bad, |_| {}), Err(DecodeError::BadKind(77)));
        let mut huge = vec![];
        write_varint(&mut huge, (MAX_ENVELOPE_BYTES + 1) as u64);
        assert!(matches!(for_each_envelope(&huge, |_| {}), Err(DecodeError::TooLarge(_))));
        assert_eq!(for_each_envelope(&[0xff; 3], |_| {}), Err(DecodeError::Truncated));
    }
}
