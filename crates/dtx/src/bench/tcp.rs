//! The tcp runtime's orchestration (filled in below).

use super::{BenchSpec, Outcome};

pub fn run(_spec: &BenchSpec, _cluster: Option<&std::path::Path>) -> anyhow::Result<Outcome> {
    anyhow::bail!("tcp runtime: not built yet")
}

pub fn serve(_config: &std::path::Path, _node: u16) -> anyhow::Result<()> {
    anyhow::bail!("server: not built yet")
}
