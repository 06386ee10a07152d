//! Durability and replication, shared by every protocol: a write-ahead log with group commit
//! ([`wal`]) and consensus-replicated logs ([`raft_log`]). Nothing here touches a protocol; the
//! runtimes hand these to protocol code through `rt::Worker`.

pub mod raft_log;
pub mod wal;
