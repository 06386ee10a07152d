//! Records the commit the binary is built from, for the provenance of experiment results.
use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown (not built from a git checkout)".to_string());
    println!("cargo:rustc-env=DTX_COMMIT={commit}");
    // A commit or a checkout moves HEAD or a branch; staging changes the index (and `--dirty`).
    for p in ["../../.git/HEAD", "../../.git/index", "../../.git/refs/heads"] {
        println!("cargo:rerun-if-changed={p}");
    }
}
