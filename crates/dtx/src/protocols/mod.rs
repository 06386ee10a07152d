//! Concurrency-control protocols, one folder each, each with the same roles:
//! `meta` (what a record carries), `coordinator` (the execution and commit of a transaction),
//! `participant` (what a node does for remote transactions), `messages` (its wire types), and
//! the background tasks in `mod.rs`. A new protocol is one folder plus a line in [`REGISTRY`].
//! What a protocol is to the engine is in [`traits`]; every protocol dtx knows, and how a user
//! names a variant of one (`NAME[:KEY=VALUE]...`, its [`options`]), in [`registry`]. Protocols
//! over two-phase commit share the skeleton in [`twopc`]; a search for cycles in graphs of
//! transactions (2PL's deadlock detector; later Detock's and Janus's SCCs), in [`graph`].

pub mod calvin;
pub mod depgraph;
pub mod detock;
pub mod graph;
pub mod maat;
#[cfg(any(test, feature = "test-protocols"))]
pub mod multilog;
pub mod mvcc;
pub mod occ;
pub mod options;
pub mod primo;
pub mod registry;
pub mod rolis;
pub mod silo;
pub mod slog;
pub mod sundial;
pub mod tictoc;
pub mod traits;
pub mod twopc;
pub mod twopl;

pub use options::{OptionKind, OptionSpec, OptionValue, Options};
pub use registry::*;
pub use traits::*;
