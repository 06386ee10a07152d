//! Consensus-replicated logs (being written).
