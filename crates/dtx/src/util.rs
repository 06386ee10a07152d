//! Small shared helpers: duration parsing, the seeded RNG, process CPU time.

use anyhow::{bail, Context};

/// The deterministic RNG used everywhere randomness must replay from a seed.
pub type Rng = rand_xoshiro::Xoshiro256PlusPlus;

pub fn rng_from_seed(seed: u64) -> Rng {
    use rand::SeedableRng;
    Rng::seed_from_u64(seed)
}

/// Parse `100us`, `1.5ms`, `2s`, `250ns` or a bare number (microseconds) into microseconds.
pub fn parse_duration_us(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let split = s.find(|c: char| c.is_ascii_alphabetic() || c == 'µ').unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.trim().parse().with_context(|| format!("`{s}` is not a duration (try 100us, 5ms, 1s)"))?;
    if !v.is_finite() || v < 0.0 {
        bail!("`{s}` is not a non-negative duration");
    }
    let scale = match unit.trim() {
        "" | "us" | "µs" => 1.0,
        "ns" => 0.001,
        "ms" => 1e3,
        "s" => 1e6,
        u => bail!("`{s}`: unknown unit `{u}` (use ns, us, ms or s)"),
    };
    Ok((v * scale).round() as u64)
}

/// CPU time (user + system) consumed by this process so far, in microseconds.
pub fn process_cpu_us() -> u64 {
    // /proc/self/stat fields 14 and 15 are utime and stime in clock ticks (100 Hz on Linux).
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // After the ')' the state is field 3, so utime (14) is index 11 and stime (15) index 12.
    (ticks(11) + ticks(12)) * 10_000
}

/// This process's resident memory now, in bytes (`/proc/self/statm`'s second field, in pages),
/// or `None` where the kernel does not say.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads no memory of ours.
    let page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page_bytes).ok()?)
}

/// Write a file so that a crash leaves the old contents or the new, never a mix: a temporary
/// file, fsynced, renamed over the target.
pub fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    f.write_all(bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    f.sync_all().with_context(|| format!("cannot sync {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

/// A scratch directory removed on drop (cluster configs, server output, the logs of a run that
/// names no `--data-dir`).
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> std::io::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let p = std::env::temp_dir().join(format!("dtx-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p)?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    /// Removes the folder, unless `DTX_KEEP_TEMP` is set (to read a failed run's server logs).
    fn drop(&mut self) {
        if std::env::var_os("DTX_KEEP_TEMP").is_some() {
            eprintln!("dtx: DTX_KEEP_TEMP is set: kept {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Give the heap's free memory back to the operating system (mimalloc's `mi_collect`, forced:
/// the calling thread's free pages and those of threads that ended, as an earlier run's workers), so that the next run starts from the same memory
/// state as the first run of a process: a run that reused the pages an earlier run freed would
/// skip the page faults and zeroing that a fresh process (and a database that keeps growing)
/// pays for every new page, about 15% of a one-node TPC-C run on a VM, and would look faster
/// for having run second.
pub fn return_free_memory() {
    extern "C" {
        // mimalloc's public API (mimalloc.h), in the library the global allocator links.
        fn mi_collect(force: bool);
    }
    // SAFETY: mi_collect only returns free pages of mimalloc's heaps; it may run on any thread.
    unsafe { mi_collect(true) }
}

/// The nice value of a tcp server's workers and its applier: below its replication thread
/// (nice 0), which sends and answers the heartbeats. With more busy threads than cores (three
/// servers on two cores) a heartbeat otherwise waits for every worker's turn, followers miss it
/// for an election timeout, and a node fails over in a run without a fault.
pub const WORKER_NICE: i32 = 5;

/// Raise the calling thread's nice value to `nice` (on Linux a nice value is a thread's), so
/// that on a host with fewer cores than busy threads the threads left at 0 get their turns
/// first. Fails when the system refuses (the caller says what then runs at normal priority).
pub fn lower_this_threads_priority(nice: i32) -> std::io::Result<()> {
    // SAFETY: setpriority reads no memory of ours; `who == 0` names the calling thread.
    match unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_us("100us").unwrap(), 100);
        assert_eq!(parse_duration_us("1.5ms").unwrap(), 1500);
        assert_eq!(parse_duration_us("2s").unwrap(), 2_000_000);
        assert_eq!(parse_duration_us("0").unwrap(), 0);
        assert_eq!(parse_duration_us("50").unwrap(), 50);
        assert!(parse_duration_us("fast").is_err());
        assert!(parse_duration_us("10 parsecs").is_err());
        assert!(parse_duration_us("-5us").is_err());
    }
}
