//! tcp runtime (below).
