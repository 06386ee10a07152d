//! The bytes of the log: records, segment headers and checkpoints, encoded and decoded with
//! their checksums. Pure functions over bytes, so the simulator's in-memory disk uses the exact
//! format the files do.

use super::*;

pub fn encode_record(lsn: Lsn, payload: &[u8], out: &mut Vec<u8>) {
    put_record(lsn, record_crc(lsn, payload), &[payload], out);
}

/// Decodes the records in `bytes[first_offset..]`; the first record may carry any LSN, each next
/// one must carry the LSN after it.
pub fn decode_records(bytes: &[u8], first_offset: usize) -> Decoded {
    decode_records_from(bytes, first_offset, None)
}

/// As [`decode_records`], but the first record must carry `first_lsn` when given (a segment's
/// header names it), which also sharpens the torn-or-corrupt decision for a bad first record.
pub fn decode_records_from(bytes: &[u8], first_offset: usize, first_lsn: Option<Lsn>) -> Decoded {
    let mut records = Vec::new();
    let mut expected = first_lsn;
    let mut at = first_offset;
    if at > bytes.len() {
        let reason = format!("decoding was asked to start past the end ({} bytes)", bytes.len());
        return Decoded { records, end: Tail::Corrupt { offset: at, reason } };
    }
    while at < bytes.len() {
        let record = match parse_record_at(bytes, at) {
            Ok(record) => record,
            Err(bad) => return Decoded { records, end: classify_bad_record(bytes, at, expected, bad) },
        };
        if let Some(want) = expected.filter(|&want| want != record.lsn) {
            let reason = format!("the record there carries LSN {} where LSN {want} was expected", record.lsn);
            return Decoded { records, end: Tail::Corrupt { offset: at, reason } };
        }
        records.push((record.lsn, record.payload));
        expected = Some(record.lsn + 1);
        at = record.end;
    }
    Decoded { records, end: Tail::Clean }
}

pub fn encode_segment_header(header: &SegmentHeader, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(SEGMENT_MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&header.node.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&header.cluster_id.to_le_bytes());
    out.extend_from_slice(&header.first_lsn.to_le_bytes());
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

pub fn decode_segment_header(bytes: &[u8]) -> Result<SegmentHeader, FormatError> {
    check_magic_and_version(bytes, SEGMENT_MAGIC, SEGMENT_HEADER_BYTES, "segment header")?;
    let (stored, computed) = (le_u32(bytes, 32), crc32fast::hash(&bytes[..32]));
    if stored != computed {
        return Err(FormatError { offset: 32, reason: checksum_reason("segment header", stored, computed) });
    }
    Ok(SegmentHeader { node: le_u16(bytes, 12), cluster_id: le_u64(bytes, 16), first_lsn: le_u64(bytes, 24) })
}

pub fn encode_checkpoint(header: &CheckpointHeader, snapshot: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&checkpoint_header_bytes(header, snapshot));
    out.extend_from_slice(snapshot);
}

/// The header and the byte range of the snapshot.
pub fn decode_checkpoint(bytes: &[u8]) -> Result<(CheckpointHeader, Range<usize>), FormatError> {
    check_magic_and_version(bytes, CHECKPOINT_MAGIC, CHECKPOINT_HEADER_BYTES, "checkpoint header")?;
    let snapshot_bytes = le_u64(bytes, 32);
    let body_bytes = (bytes.len() - CHECKPOINT_HEADER_BYTES) as u64;
    if snapshot_bytes != body_bytes {
        let reason = format!("the header announces a snapshot of {snapshot_bytes} bytes but {body_bytes} follow");
        return Err(FormatError { offset: 32, reason });
    }
    let snapshot = CHECKPOINT_HEADER_BYTES..bytes.len();
    let mut crc = Hasher::new();
    crc.update(&bytes[..40]);
    crc.update(&bytes[snapshot.clone()]);
    let (stored, computed) = (le_u32(bytes, 40), crc.finalize());
    if stored != computed {
        return Err(FormatError { offset: 40, reason: checksum_reason("checkpoint", stored, computed) });
    }
    let header = CheckpointHeader { node: le_u16(bytes, 12), cluster_id: le_u64(bytes, 16), lsn: le_u64(bytes, 24) };
    Ok((header, snapshot))
}

pub(super) fn checkpoint_header_bytes(header: &CheckpointHeader, snapshot: &[u8]) -> [u8; CHECKPOINT_HEADER_BYTES] {
    let mut out = [0u8; CHECKPOINT_HEADER_BYTES];
    out[..8].copy_from_slice(CHECKPOINT_MAGIC);
    out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    out[12..14].copy_from_slice(&header.node.to_le_bytes());
    out[16..24].copy_from_slice(&header.cluster_id.to_le_bytes());
    out[24..32].copy_from_slice(&header.lsn.to_le_bytes());
    out[32..40].copy_from_slice(&(snapshot.len() as u64).to_le_bytes());
    let mut crc = Hasher::new();
    crc.update(&out[..40]);
    crc.update(snapshot);
    out[40..].copy_from_slice(&crc.finalize().to_le_bytes());
    out
}

/// The format version a segment or checkpoint says it has, when it is not this build's: a file
/// of another version is refused as such, not as a corrupt one.
pub(super) fn other_version(bytes: &[u8], magic: &[u8; 8]) -> Option<u32> {
    (bytes.len() >= 12 && &bytes[..8] == magic).then(|| le_u32(bytes, 8)).filter(|&v| v != FORMAT_VERSION)
}

/// [`other_version`] as the error recovery stops with.
pub(super) fn check_version(path: &Path, bytes: &[u8], magic: &[u8; 8]) -> Result<(), WalError> {
    match other_version(bytes, magic) {
        Some(found) => Err(WalError::OtherVersion { path: path.to_path_buf(), found, expected: FORMAT_VERSION }),
        None => Ok(()),
    }
}

pub(super) fn check_magic_and_version(
    bytes: &[u8],
    magic: &[u8; 8],
    header_bytes: usize,
    what: &str,
) -> Result<(), FormatError> {
    if bytes.len() < header_bytes {
        let reason = format!("the file has {} bytes, fewer than a {what} of {header_bytes}", bytes.len());
        return Err(FormatError { offset: bytes.len(), reason });
    }
    if &bytes[..8] != magic {
        let reason = format!("the {what} does not start with the magic {:?}", String::from_utf8_lossy(magic));
        return Err(FormatError { offset: 0, reason });
    }
    let version = le_u32(bytes, 8);
    if version != FORMAT_VERSION {
        let reason = format!("the {what} has format version {version}, this build reads version {FORMAT_VERSION}");
        return Err(FormatError { offset: 8, reason });
    }
    Ok(())
}

pub(super) fn checksum_reason(what: &str, stored: u32, computed: u32) -> String {
    format!("the {what} checksum does not match (stored {stored:#010x}, computed {computed:#010x})")
}

/// A record's checksum covers its payload, then its LSN (so that a stale record left in a reused
/// file reads as stale). The LSN goes last because appenders checksum the payload before the
/// record is numbered: numbering then only continues that checksum over 8 bytes
/// ([`record_crc_of`]), where LSN-first would need a `combine`, about 180 ns a record.
pub(super) fn record_crc(lsn: Lsn, payload: &[u8]) -> u32 {
    let mut crc = Hasher::new();
    crc.update(payload);
    record_crc_of(lsn, crc)
}

/// The record checksum from the payload's running checksum (see [`record_crc`]).
pub(super) fn record_crc_of(lsn: Lsn, mut payload_crc: Hasher) -> u32 {
    payload_crc.update(&lsn.to_le_bytes());
    payload_crc.finalize()
}

/// Encode a record whose payload is `parts` one after the other.
pub(super) fn put_record(lsn: Lsn, crc: u32, parts: &[&[u8]], out: &mut Vec<u8>) {
    let payload_bytes: usize = parts.iter().map(|p| p.len()).sum();
    debug_assert!(payload_bytes <= MAX_RECORD_BYTES, "record of {payload_bytes} bytes over the limit");
    out.reserve(RECORD_HEADER_BYTES + payload_bytes);
    out.extend_from_slice(&(payload_bytes as u32).to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&lsn.to_le_bytes());
    for p in parts {
        out.extend_from_slice(p);
    }
}

pub(super) struct RawRecord {
    pub(super) lsn: Lsn,
    pub(super) payload: Range<usize>,
    pub(super) end: usize,
}

/// Why the bytes at an offset are not a record; kept cheap because the torn-tail scan tries
/// every offset.
pub(super) enum BadRecord {
    Short { remaining: usize },
    TooLong { len: usize },
    PastEnd { len: usize, end: usize, available: usize },
    Checksum { stored: u32, computed: u32 },
    ZeroLsn,
}

impl fmt::Display for BadRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            BadRecord::Short { remaining } => {
                write!(f, "only {remaining} bytes remain where a {RECORD_HEADER_BYTES}-byte record header should be")
            }
            BadRecord::TooLong { len } => {
                write!(f, "the record's length field says {len} bytes, over the limit of {MAX_RECORD_BYTES}")
            }
            BadRecord::PastEnd { len, end, available } => write!(
                f,
                "the record of {len} bytes would end at offset {end}, past the end of the data at {available}"
            ),
            BadRecord::Checksum { stored, computed } => f.write_str(&checksum_reason("record", stored, computed)),
            BadRecord::ZeroLsn => f.write_str("the record carries LSN 0, which no record has"),
        }
    }
}

pub(super) fn parse_record_at(bytes: &[u8], at: usize) -> Result<RawRecord, BadRecord> {
    let available = bytes.len();
    let remaining = available.saturating_sub(at);
    if remaining < RECORD_HEADER_BYTES {
        return Err(BadRecord::Short { remaining });
    }
    let len = le_u32(bytes, at) as usize;
    if len > MAX_RECORD_BYTES {
        return Err(BadRecord::TooLong { len });
    }
    let end = at + RECORD_HEADER_BYTES + len;
    if end > available {
        return Err(BadRecord::PastEnd { len, end, available });
    }
    let lsn = le_u64(bytes, at + 8);
    let payload = at + RECORD_HEADER_BYTES..end;
    let (stored, computed) = (le_u32(bytes, at + 4), record_crc(lsn, &bytes[payload.clone()]));
    if stored != computed {
        return Err(BadRecord::Checksum { stored, computed });
    }
    if lsn == 0 {
        return Err(BadRecord::ZeroLsn);
    }
    Ok(RawRecord { lsn, payload, end })
}

/// A bad record is a torn write only if nothing valid follows it; otherwise records after it
/// would be silently lost, so it is corruption.
pub(super) fn classify_bad_record(bytes: &[u8], at: usize, expected: Option<Lsn>, bad: BadRecord) -> Tail {
    match find_valid_record_after(bytes, at, expected) {
        None => Tail::Torn { offset: at },
        Some((later_at, lsn)) => Tail::Corrupt {
            offset: at,
            reason: format!("{bad}, yet a valid record with LSN {lsn} follows at offset {later_at}"),
        },
    }
}

/// The first offset after `bad_at` from which a valid record with an LSN at or after `expected`
/// decodes. With `expected` known, the LSN is also bounded above: each of the records lost in
/// between took at least a record header, so at most `(offset - bad_at) / 16` are missing.
pub(super) fn find_valid_record_after(bytes: &[u8], bad_at: usize, expected: Option<Lsn>) -> Option<(usize, Lsn)> {
    let last_start = bytes.len().checked_sub(RECORD_HEADER_BYTES)?;
    let min_lsn = expected.unwrap_or(1);
    (bad_at + 1..=last_start).find_map(|at| {
        let lsn = le_u64(bytes, at + 8);
        let max_lsn = expected.map_or(Lsn::MAX, |e| e.saturating_add(((at - bad_at) / RECORD_HEADER_BYTES) as u64));
        if lsn < min_lsn || lsn > max_lsn {
            return None;
        }
        parse_record_at(bytes, at).ok().map(|record| (at, record.lsn))
    })
}

// Callers check lengths first; these only read fixed-size little-endian fields.
pub(super) fn le_u16(bytes: &[u8], at: usize) -> u16 {
    let mut field = [0u8; 2];
    field.copy_from_slice(&bytes[at..at + 2]);
    u16::from_le_bytes(field)
}

pub(super) fn le_u32(bytes: &[u8], at: usize) -> u32 {
    let mut field = [0u8; 4];
    field.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(field)
}

pub(super) fn le_u64(bytes: &[u8], at: usize) -> u64 {
    let mut field = [0u8; 8];
    field.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(field)
}
