//! How a message to a worker of a protocol over the skeleton is framed: a one-byte tag says
//! whether it is the concurrency control's own request, one of the skeleton's termination
//! protocol, a reconnaissance read, or a message between commit gates; what follows is the
//! encoded message. The skeleton and the commit policies both frame through here, so that
//! neither imports the other for it.

use serde::Serialize;

pub const TAG_CC: u8 = 0;
pub const TAG_TERMINATION: u8 = 1;
pub const TAG_PEEK: u8 = 2;
/// The concurrency control's request, after the era it was made in (8 bytes, little-endian):
/// the epoch under `commit=epoch`, the agreement term under `commit=wm`. A participant in
/// another era, or recovering, refuses it.
pub const TAG_CC_IN_ERA: u8 = 3;
/// `commit=epoch`: a message between epoch gates ([`super::commit::epoch::GateMsg`]), one-way.
pub const TAG_EPOCH: u8 = 4;
/// `commit=wm`: a message between watermark gates ([`super::commit::watermark::WmGateMsg`]),
/// one-way.
pub const TAG_WM: u8 = 5;

/// `value` encoded behind a one-byte tag, in one allocation (every remote request goes through
/// here).
pub fn framed(tag: u8, value: &impl Serialize) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(tag);
    postcard::to_extend(value, out).expect("a message encodes into memory")
}

/// A concurrency control's request made in `era`.
pub fn framed_in_era(era: u64, value: &impl Serialize) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(TAG_CC_IN_ERA);
    out.extend_from_slice(&era.to_le_bytes());
    postcard::to_extend(value, out).expect("a message encodes into memory")
}

/// The era of a request framed by [`framed_in_era`], and the request (`None`: too short).
pub fn split_era(rest: &[u8]) -> Option<(u64, &[u8])> {
    let (era, rest) = rest.split_at_checked(8)?;
    Some((u64::from_le_bytes(era.try_into().expect("eight bytes")), rest))
}
