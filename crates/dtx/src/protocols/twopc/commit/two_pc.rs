//! Plain 2PC over the log (`commit=2pc`, the default): every vote and decision is durable
//! before it is answered or acted on, so the policy logs nothing of its own, holds no record
//! back at replay and has no gate (the skeleton waits at the node's log: [`super::Gate::TwoPc`]).

use super::{CommitPolicy, Gate, GateNode, Policy};
use crate::protocols::twopc::durable::{CcLog, CoreReplay, NoRecord, PolicyLog};
use serde::{Deserialize, Serialize};

/// The log of plain 2PC: nothing beside 2PC's own records.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TwoPcLog;

impl PolicyLog for TwoPcLog {
    const NAME: &'static str = "2pc";
    type Record = NoRecord;
    type Recovered = ();

    fn apply<L: CcLog>(&mut self, record: NoRecord, _core: &mut CoreReplay<L>) {
        match record {}
    }

    fn recover<L: CcLog>(&self, _core: &CoreReplay<L>) -> ((), Option<CoreReplay<L>>) {
        ((), None)
    }
}

impl Policy for TwoPcLog {
    fn gate(_recovered: (), _node: GateNode<'_>, commit: CommitPolicy) -> Gate {
        debug_assert_eq!(commit, CommitPolicy::TwoPc, "plain 2PC's gate for another policy");
        Gate::TwoPc
    }
}
