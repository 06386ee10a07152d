//! Primo's own cases; the shared sweeps run it with every other protocol.
