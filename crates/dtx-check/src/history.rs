//! The history format: one JSON object per line, one line per finished transaction attempt.

use anyhow::{anyhow, bail};
use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::BufRead;

/// Outcome of a transaction attempt as observed by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The commit was acknowledged.
    #[serde(alias = "ok", alias = "commit")]
    Committed,
    /// The attempt aborted: none of its effects may be visible.
    #[serde(alias = "fail", alias = "abort")]
    Aborted,
    /// The client could not learn the outcome (Elle's `:info`): its appends may or may not be
    /// visible, its reads carry no information.
    #[serde(alias = "info")]
    Unknown,
}

/// One micro-operation of a transaction.
///
/// On the wire: `["r", key, [v1, v2, ...]]` (or `["r", key, null]` if the read never returned),
/// `["append", key, value]`, and `["retire", key, [v1, v2, ...]]`, a read by the transaction
/// that retires the key (see [`Op::Read`]'s `retires`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Read of the whole list stored under `key`; `None` if the read did not return.
    /// `retires`: the reader retires the key (a workload that reuses its storage for a fresh
    /// key): no append to it may follow, so every committed append to it must be in `list`,
    /// as in the final read.
    Read { key: u64, list: Option<Vec<u64>>, retires: bool },
    /// Append of `value` to the list stored under `key`.
    Append { key: u64, value: u64 },
}

impl Op {
    /// The key this operation touches.
    pub fn key(&self) -> u64 {
        match self {
            Op::Read { key, .. } | Op::Append { key, .. } => *key,
        }
    }
}

impl Serialize for Op {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(3))?;
        match self {
            Op::Read { key, list, retires } => {
                seq.serialize_element(if *retires { "retire" } else { "r" })?;
                seq.serialize_element(key)?;
                seq.serialize_element(list)?;
            }
            Op::Append { key, value } => {
                seq.serialize_element("append")?;
                seq.serialize_element(key)?;
                seq.serialize_element(value)?;
            }
        }
        seq.end()
    }
}

#[derive(Deserialize)]
enum OpName {
    #[serde(rename = "r", alias = "read")]
    Read,
    #[serde(rename = "append")]
    Append,
    #[serde(rename = "retire")]
    Retire,
}

struct OpVisitor;

impl<'de> Visitor<'de> for OpVisitor {
    type Value = Op;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(
            r#"an operation ["r", key, [values...] or null], ["append", key, value] or ["retire", key, [values...]]"#,
        )
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Op, A::Error> {
        let name: OpName = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(0, &self))?;
        let key: u64 = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(1, &self))?;
        let op = match name {
            OpName::Read | OpName::Retire => Op::Read {
                key,
                list: seq.next_element::<Option<Vec<u64>>>()?.ok_or_else(|| de::Error::invalid_length(2, &self))?,
                retires: matches!(name, OpName::Retire),
            },
            OpName::Append => {
                Op::Append { key, value: seq.next_element()?.ok_or_else(|| de::Error::invalid_length(2, &self))? }
            }
        };
        if seq.next_element::<IgnoredAny>()?.is_some() {
            return Err(de::Error::invalid_length(4, &self));
        }
        Ok(op)
    }
}

impl<'de> Deserialize<'de> for Op {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Op, D::Error> {
        d.deserialize_seq(OpVisitor)
    }
}

/// One finished transaction attempt (one line of the history).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Txn {
    pub id: u64,
    pub status: Status,
    pub ops: Vec<Op>,
    /// Client-side invocation time, microseconds (optional; only used by the lost-append check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_us: Option<u64>,
    /// Client-side completion time, microseconds (optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_us: Option<u64>,
}

/// Parses one (non-blank) line; `lineno` is 1-based and only used in error messages.
pub fn parse_line(line: &str, lineno: usize) -> anyhow::Result<Txn> {
    let txn: Txn = serde_json::from_str(line).map_err(|e| {
        let msg = e.to_string();
        // serde_json appends " at line 1 column N"; the line is ours, keep only the column.
        let msg = match msg.rsplit_once(" at line ") {
            Some((m, _)) => m.to_string(),
            None => msg,
        };
        anyhow!("line {lineno}, column {}: {msg}", e.column())
    })?;
    if let (Some(s), Some(e)) = (txn.start_us, txn.end_us) {
        if s > e {
            bail!("line {lineno}: transaction {}: start_us ({s}) is after end_us ({e})", txn.id);
        }
    }
    Ok(txn)
}

/// Reads a whole history (JSON lines; blank lines are skipped).
pub fn read_history<R: BufRead>(mut r: R) -> anyhow::Result<Vec<Txn>> {
    let mut txns = Vec::new();
    let mut buf = String::new();
    let mut lineno = 0usize;
    loop {
        buf.clear();
        lineno += 1;
        let n = r.read_line(&mut buf).map_err(|e| anyhow!("line {lineno}: cannot read line: {e}"))?;
        if n == 0 {
            break;
        }
        let line = buf.trim();
        if line.is_empty() {
            continue;
        }
        txns.push(parse_line(line, lineno)?);
    }
    Ok(txns)
}
