//! A private network for `--faults partition` on `tcp`.
//!
//! A partition cuts links between servers while every server keeps running, so it needs a
//! firewall rule, and a firewall rule must not touch the machine's own network. The bench, asked
//! for partitions, runs itself again inside a network namespace of its own (`ip netns exec`,
//! marked by [`INSIDE_ENV`]), which is deleted with every rule in it when that run ends. Inside,
//! server `n` listens on its own loopback address ([`server_ip`]) and its connections leave from
//! it (`rt::tcp`), while the bench keeps 127.0.0.1: a rule that drops what goes between two
//! servers' addresses cuts their link and leaves the bench's control connections alone. This is
//! what the link-cut test (`tests/tcp_durability.rs`) does by hand. It needs root, iproute2 and
//! iptables.

use anyhow::{bail, Context};
use std::net::Ipv4Addr;
use std::process::Command;

/// Set (to the namespace's name) in the bench run again inside its namespace.
const INSIDE_ENV: &str = "DTX_BENCH_NETNS";
/// The chain, hooked into INPUT, that holds the rules of the current cut.
const CHAIN: &str = "dtx-partition";

/// Whether this process is a bench running inside the namespace made for it.
pub fn inside() -> bool {
    std::env::var_os(INSIDE_ENV).is_some()
}

/// Server `n`'s address inside the namespace: 127.0.0.2 onwards (the bench keeps 127.0.0.1).
pub fn server_ip(n: usize) -> Ipv4Addr {
    let i = n + 2;
    assert!(i < 1 << 16, "server {n}: no loopback address left for it");
    Ipv4Addr::new(127, 0, (i >> 8) as u8, i as u8)
}

/// Run this same command again inside a fresh network namespace, wait for it, delete the
/// namespace, and exit with the inner run's status.
pub fn rerun_inside() -> anyhow::Result<std::convert::Infallible> {
    let ns = Namespace::make()?;
    let exe = std::env::current_exe().context("cannot find the dtx executable")?;
    eprintln!("dtx: --faults partition: running the bench inside network namespace {}", ns.0);
    let status = Command::new("ip")
        .args(["netns", "exec", &ns.0])
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env(INSIDE_ENV, &ns.0)
        .status()
        .context("cannot run the bench inside its network namespace")?;
    drop(ns);
    std::process::exit(status.code().unwrap_or(2))
}

/// Cut server `cut` off from every other one of `servers` (both directions), leaving the
/// bench's connections to it alone; [`heal`] undoes it.
pub fn cut_off(cut: usize, servers: usize) -> anyhow::Result<()> {
    for other in (0..servers).filter(|&m| m != cut) {
        for (from, to) in [(cut, other), (other, cut)] {
            let (from, to) = (server_ip(from).to_string(), server_ip(to).to_string());
            iptables(&["-A", CHAIN, "-s", &from, "-d", &to, "-j", "DROP"])?;
        }
    }
    Ok(())
}

/// Remove every rule of the current cut: the links heal (TCP resends what the cut dropped).
/// Returns how many packets the cut dropped, which shows it did cut something.
pub fn heal() -> anyhow::Result<u64> {
    let listing = run("iptables", &["-L", CHAIN, "-n", "-v", "-x"])?;
    iptables(&["-F", CHAIN])?;
    // Below two header lines, each rule's line starts with its packet count.
    Ok(listing.lines().skip(2).filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok()).sum())
}

fn iptables(args: &[&str]) -> anyhow::Result<()> {
    run("iptables", args).map(drop)
}

/// Run `program` with `args`, failing with its error output; its standard output.
fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program).args(args).output().with_context(|| {
        format!("cannot run `{program}`: --faults partition on tcp needs iproute2 and iptables installed")
    })?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}; --faults partition on tcp needs root (it makes a network namespace \
             and firewall rules), or use --runtime sim",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A network namespace made for one bench, deleted (with its rules) when dropped.
struct Namespace(String);

impl Namespace {
    fn make() -> anyhow::Result<Namespace> {
        let name = format!("dtx-bench-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run("ip", &["netns", "add", &name])?;
        let ns = Namespace(name);
        let inside = |program: &str, args: &[&str]| {
            let mut all = vec!["netns", "exec", ns.0.as_str(), program];
            all.extend_from_slice(args);
            run("ip", &all).map(drop)
        };
        inside("ip", &["link", "set", "lo", "up"])?;
        inside("iptables", &["-N", CHAIN])?;
        inside("iptables", &["-A", "INPUT", "-j", CHAIN])?;
        Ok(ns)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}
