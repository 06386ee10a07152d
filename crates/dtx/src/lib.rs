//! dtx: one engine in which serializable distributed transaction protocols run side by side on
//! the same storage, network, workloads and driver. See docs/architecture.md.

// dtx is an application whose library is its own: its docs are read as a map of the engine,
// private items included (`cargo doc --document-private-items`), and a public item's doc may
// point at the private one that explains it.
#![allow(rustdoc::private_intra_doc_links)]

pub mod bench;
pub mod cli;
pub mod cluster;
pub mod host;
pub mod net;
pub mod protocols;
pub mod replication;
pub mod rt;
pub mod storage;
#[cfg(any(test, feature = "test-protocols"))]
mod testkit;
pub mod txn;
pub mod util;
pub mod wal;
pub mod workloads;

/// Every allocation in dtx (the binary, and the tests that run clusters in process) goes
/// through mimalloc: see Cargo.toml for why.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
