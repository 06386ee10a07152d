//! Write-ahead log with group commit (being written).
