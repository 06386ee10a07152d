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
    /// Run one bench run described in REQUEST and write its report to ANSWER: how `dtx bench`
    /// and `dtx experiment run` start each run in a fresh process.
    #[command(hide = true)]
    RunOne { request: PathBuf, answer: PathBuf },
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

fn main() -> ExitCode {
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
    // Every bench and experiment run starts in a process of its own (cli::fresh_process).
    dtx::cli::fresh_process::enable(true);
    let result = match cli.cmd {
        Cmd::Bench(args) => {
            dtx::cli::fresh_process::enable(!args.same_process());
            dtx::cli::bench(&(*args).into())
        }
        Cmd::RunOne { request, answer } => dtx::cli::fresh_process::serve(&request, &answer),
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
