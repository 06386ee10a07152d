//! Primo's messages. Per remote partition of a distributed transaction: its reads, each locking
//! what it reads (`Lock`, one round trip per partition in one-shot mode, one per read
//! otherwise; a write to a key it did not read locks it with a dummy read), a range as `Scan`,
//! and at commit one `Install` that extends, installs and unlocks. Under `wcf=off` reads lock
//! shared and the prepare round is a `Lock` in exclusive mode of the keys written there. `Install` is one-way in the
//! paper; here it is answered, off the client's path, only so that a lost one is sent again.
//! An abort is the skeleton's `Abort`.

use super::Primo;
use crate::protocols::twopc::durable::Writes;
use crate::protocols::twopc::lease::Lease;
use crate::protocols::twopc::record_lock::{Mode, Prio};
use crate::protocols::twopc::{Messages, TxnId};
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, Scan};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// Lock each record for `txn` in `mode` (WAIT_DIE; exclusive under WCF, and for a prepare
    /// under `wcf=off`, an upgrade of a shared lock), raise its version past the partition's
    /// floor (R2), and answer its value and lease.
    /// `era`: under `commit=wm` the recovery agreement term the transaction runs in, which a
    /// partition in another refuses (`wm-recovered`); under `commit=epoch` its epoch (the
    /// skeleton refuses the request in another).
    Lock { txn: TxnId, era: u64, prio: Prio, mode: Mode, keys: Vec<RowKey> },
    /// Lock the existing rows of a range, as `Lock` does each.
    Scan { txn: TxnId, era: u64, prio: Prio, mode: Mode, scan: Scan },
    /// The commit at `ts`: extend the lease of every record `txn` holds here to `ts`, install its
    /// `writes` at `ts`, log them, release. A partition that has gone through an agreement since
    /// `era`, or where the epoch `era` failed, rolled the transaction back: it releases instead.
    /// Served in any epoch (`era` says which it belongs to).
    Install { txn: TxnId, era: u64, ts: u64, writes: Writes },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    /// `Lock`: each record's value and lease, in order, all locked.
    Locked(Vec<(Option<Value>, Lease)>),
    /// `Scan`: the rows locked, with their leases.
    Rows(Vec<(u64, Value, Lease)>),
    Installed,
    Aborted(Abort),
}

/// The requests and replies of Primo, as the skeleton carries them.
impl Messages for Primo {
    type Request = Request;
    type Reply = Reply;
}
