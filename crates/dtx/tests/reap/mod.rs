//! What the tcp test files share: server processes that are killed and reaped when dropped.

use std::process::Child;

/// Server processes killed and reaped when dropped, whatever the test did (and before any
/// network namespace they run in goes).
pub struct Reap(pub Vec<Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
