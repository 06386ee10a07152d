//! The `dtx` command: bench, server, protocols, check.

use clap::{Parser, Subcommand};
use dtx::cli::BenchArgs;
use dtx::protocols;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "dtx", version, about = "Serializable distributed transaction protocols, side by side")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a benchmark: every protocol on the same cluster, workload and driver.
    Bench(Box<BenchArgs>),
    /// List the protocols: name, status, description; with --options NAME, a protocol's options.
    Protocols {
        /// List this protocol's options (give them as `NAME:KEY=VALUE` to --protocol) and the
        /// abort reasons it defines.
        #[arg(long, value_name = "NAME")]
        options: Option<String>,
    },
    /// Paper figures as named experiments: list them, run one (or all), report them as HTML.
    Experiment {
        #[command(subcommand)]
        cmd: dtx::cli::experiment::ExperimentCmd,
    },
    /// Check a list-append history for serializability.
    Check {
        #[arg(long)]
        history: PathBuf,
        /// Print the full report as JSON.
        #[arg(long)]
        json: bool,
        /// Strict serializability: the serial order must also agree with real time (a
        /// transaction that ended before another started comes first).
        #[arg(long)]
        realtime: bool,
    },
    /// Run one node of a cluster (the bench and clients talk to it).
    Server {
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        node: u16,
        /// Keep logs here (durable runs): one folder per cluster, recovered after a restart.
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
}

/// The glibc tunables `dtx` runs with:
/// - `hugetlb=1`, `top_pad=4194304`: back the heaps with transparent huge pages, and grow the
///   main heap 4 MiB at a time so that a growth fault can take a whole huge page. Inserting
///   workloads (TPC-C's orders) grow the heap by hundreds of MB per second; on 4 KiB pages every
///   page costs a fault and a zeroing, 5-10% of one-node TPC-C on the reference machine.
/// - `tcache_count=256`: keep up to 256 freed chunks of each size in the freeing thread's cache
///   (glibc's default is 7). A record's value is often freed by another worker than the one that
///   allocated it (the last reader drops it), and a free that overflows the cache goes back to the
///   allocating thread's arena under that arena's lock, where the two workers then sleep on each
///   other: OCC one-node TPC-C +3.5% to +15% in four sets of alternating runs (its read sets hold
///   values across commits), 2PL +0-2%.
/// - `mmap_threshold=4194304`, `trim_threshold=67108864`: take blocks up to 4 MiB from the heap
///   rather than from a fresh mapping each, and keep up to 64 MiB free at a heap's top. A
///   replicated log's entries are large (Rolis's batch of TPC-C write sets is ~500 KB) and each is
///   copied a few times on its way through Raft; with glibc's defaults each copy mapped, faulted in
///   and zeroed new pages and unmapped them again. Rolis on three nodes' TPC-C in `local`:
///   46k to 90-91k committed/s (two alternating pairs); one-node silo and OCC unchanged within
///   noise (three pairs each).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MALLOC_TUNABLES: &str = "glibc.malloc.hugetlb=1:glibc.malloc.top_pad=4194304:glibc.malloc.tcache_count=256:\
     glibc.malloc.mmap_threshold=4194304:glibc.malloc.trim_threshold=67108864";

/// Start this program again with [`MALLOC_TUNABLES`], unless the environment already tunes
/// `glibc.malloc.hugetlb` (or `DTX_SMALL_PAGES` is set, which keeps glibc's defaults). The
/// tunables are read once, by the dynamic loader, so they cannot be set from inside the process.
/// Returns only if the re-exec failed, and then the program carries on as it is.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn reexec_with_malloc_tunables() {
    use std::os::unix::process::CommandExt;
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if tunables.contains("glibc.malloc.hugetlb") || std::env::var_os("DTX_SMALL_PAGES").is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else { return };
    let joined =
        if tunables.is_empty() { MALLOC_TUNABLES.to_string() } else { format!("{tunables}:{MALLOC_TUNABLES}") };
    let err = std::process::Command::new(exe).args(std::env::args_os().skip(1)).env("GLIBC_TUNABLES", joined).exec();
    eprintln!("dtx: note: could not restart with its malloc tunables ({err}); going on with glibc's defaults");
}

fn main() -> ExitCode {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    reexec_with_malloc_tunables();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // A value a flag refuses is one line naming the flag and why; everything else (help,
        // a missing or unknown flag) as clap shows it, with its usage.
        Err(e)
            if matches!(e.kind(), clap::error::ErrorKind::ValueValidation | clap::error::ErrorKind::InvalidValue) =>
        {
            let text = e.render().to_string();
            eprintln!("dtx: {}", text.lines().next().unwrap_or_default());
            return ExitCode::from(2);
        }
        Err(e) => e.exit(),
    };
    let result = match cli.cmd {
        Cmd::Bench(args) => dtx::cli::bench(&(*args).into()),
        Cmd::Protocols { options: None } => {
            for p in protocols::REGISTRY {
                println!("{:<12} {:<8} {:<20} {}", p.name, p.status, p.guarantee.as_str(), p.description);
            }
            for (name, desc) in protocols::PLANNED {
                println!("{:<12} {:<8} {:<20} {}", name, "planned", "", desc);
            }
            Ok(true)
        }
        Cmd::Protocols { options: Some(name) } => dtx::cli::protocol_options(&name),
        Cmd::Experiment { cmd } => dtx::cli::experiment::experiment(cmd, env!("DTX_COMMIT")),
        Cmd::Check { history, json, realtime } => dtx::cli::check(&history, json, realtime),
        Cmd::Server { config, node, data_dir } => dtx::host::tcp::serve(&config, node, data_dir).map(|_| true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("dtx: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
