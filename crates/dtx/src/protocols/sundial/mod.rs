//! Sundial (Yu, Xia, Pavlo, Sanchez, Rudolph, Devadas; PVLDB 11(10), 2018): per-tuple logical
//! leases, a commit timestamp computed from them, write-write conflicts under 2PL WAIT_DIE and
//! read-write conflicts resolved optimistically in logical time, and a cache of remote reads
//! kept coherent by the same leases. docs/architecture.md ("The planned protocols") says how it
//! plugs into the 2PC skeleton.
//!
//! Built so far, and unit-tested: the lease rules with the paper's worked examples ([`lease`]),
//! the logged upper bound that makes leases survive a crash, and the cache policies with the
//! hybrid's votes ([`policy`]); the bounded cache itself is a storage piece
//! ([`crate::storage::cache`]). The coordinator and participant over the skeleton come next:
//! until they do, `sundial` stays `planned` in `dtx protocols`.

pub mod lease;
pub mod policy;
