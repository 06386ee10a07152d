//! Reconnaissance (OLLP): run a procedure once against a snapshot, without concurrency control,
//! to learn the keys it will touch; the real one-shot run is then checked against that set.

use super::{Access, Ctx, KeySet, Procedures, Scan, Step, TxnRequest, TxnResult};
use crate::rt::LocalBoxFuture;
use crate::storage::{RowKey, Value};
use rustc_hash::FxHashMap;

/// Snapshot reads for reconnaissance, supplied by the protocol (local or remote, no locks).
pub trait SnapshotReader {
    fn read<'a>(&'a self, key: RowKey) -> LocalBoxFuture<'a, TxnResult<Option<Value>>>;
    fn scan<'a>(&'a self, scan: Scan) -> LocalBoxFuture<'a, TxnResult<Vec<(u64, Value)>>>;
}

struct ReconAccess<'r> {
    reader: &'r dyn SnapshotReader,
    keys: KeySet,
    written: FxHashMap<RowKey, Option<Value>>,
}

impl<'r> Access for ReconAccess<'r> {
    fn read(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        self.keys.read(key);
        if let Some(v) = self.written.get(&key) {
            return Step::Ready(Ok(v.clone()));
        }
        Step::Wait(self.reader.read(key))
    }

    fn read_for_update(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        self.keys.write(key);
        self.read(key)
    }

    fn write(&mut self, key: RowKey, value: Option<Value>) -> Step<'_, ()> {
        self.keys.write(key);
        self.written.insert(key, value);
        Step::Ready(Ok(()))
    }

    fn scan(&mut self, scan: Scan) -> Step<'_, Vec<(u64, Value)>> {
        if !self.keys.scans.contains(&scan) {
            self.keys.scans.push(scan);
        }
        let reader = self.reader;
        Step::Wait(Box::pin(async move {
            let rows = reader.scan(scan).await?;
            Ok(rows)
        }))
    }
}

/// Discover the key set of `req` by running it against snapshot reads. Its scans are recorded
/// as they were made (`KeySet::scans`); rows a scan returns are added as reads by the
/// procedure's own `read` calls, which is how our procedures use scans.
pub async fn discover(workload: &dyn Procedures, req: &TxnRequest, reader: &dyn SnapshotReader) -> TxnResult<KeySet> {
    let mut acc = ReconAccess { reader, keys: KeySet::default(), written: FxHashMap::default() };
    {
        let mut ctx = Ctx::new(&mut acc);
        workload.run(req, &mut ctx).await?;
    }
    Ok(acc.keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::PartitionId;
    use crate::storage::TableDef;
    use crate::txn::{Abort, KeySet, ProcFuture, TxnOutput};
    use std::cell::RefCell;

    /// Reads a pointer, then writes the record it points to: the write key depends on a read.
    struct Chase;

    fn ptr(v: &Option<Value>) -> u64 {
        v.as_deref().map(|b| b[0] as u64).unwrap_or(0)
    }

    impl Procedures for Chase {
        fn tables(&self, _p: &[PartitionId]) -> Vec<TableDef> {
            vec![]
        }
        fn procedures(&self) -> &'static [&'static str] {
            &["chase"]
        }
        fn partition_of(&self, _key: RowKey) -> PartitionId {
            0
        }
        fn load_partition(&self, _p: PartitionId, _sink: &mut dyn FnMut(RowKey, Value)) {}
        fn encode_args(&self, _req: &TxnRequest) -> Vec<u8> {
            Vec::new()
        }
        fn decode_args(
            &self,
            _proc: &'static str,
            _bytes: &[u8],
        ) -> Result<crate::txn::Args, crate::txn::RequestError> {
            Ok(std::sync::Arc::new(()))
        }
        fn declare(&self, _req: &TxnRequest, keys: &mut KeySet) -> bool {
            keys.read(RowKey::new(0, 0));
            false
        }
        fn run<'a, 'b: 'a>(&'a self, _req: &'a TxnRequest, ctx: &'a mut Ctx<'b>) -> ProcFuture<'a> {
            Box::pin(async move {
                let target = ptr(&ctx.read(RowKey::new(0, 0)).await?);
                ctx.write(RowKey::new(1, target), Value::copy_from(b"x")).await?;
                Ok(TxnOutput::default())
            })
        }
    }

    /// A snapshot that answers reads from a map the test can change between runs.
    struct Snapshot(RefCell<rustc_hash::FxHashMap<RowKey, Value>>);

    impl SnapshotReader for Snapshot {
        fn read<'a>(&'a self, key: RowKey) -> LocalBoxFuture<'a, TxnResult<Option<Value>>> {
            let v = self.0.borrow().get(&key).cloned();
            Box::pin(async move { Ok(v) })
        }
        fn scan<'a>(&'a self, _scan: Scan) -> LocalBoxFuture<'a, TxnResult<Vec<(u64, Value)>>> {
            Box::pin(async { Ok(vec![]) })
        }
    }

    /// An Access over the same snapshot, for running the procedure "for real".
    struct Direct<'s>(&'s Snapshot);

    impl Access for Direct<'_> {
        fn read(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
            Step::Ready(Ok(self.0 .0.borrow().get(&key).cloned()))
        }
        fn write(&mut self, key: RowKey, value: Option<Value>) -> Step<'_, ()> {
            if let Some(v) = value {
                self.0 .0.borrow_mut().insert(key, v);
            }
            Step::Ready(Ok(()))
        }
        fn scan(&mut self, _scan: Scan) -> Step<'_, Vec<(u64, Value)>> {
            Step::Ready(Ok(vec![]))
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut f = std::pin::pin!(f);
        loop {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
        }
    }

    #[test]
    fn reconnaissance_finds_dependent_keys_and_a_changed_pointer_aborts() {
        let snap = Snapshot(RefCell::new(Default::default()));
        snap.0.borrow_mut().insert(RowKey::new(0, 0), Value::copy_from(&[7]));
        let req = TxnRequest::new("chase", 0, ());
        let mut declared = KeySet::default();
        assert!(!Chase.declare(&req, &mut declared), "the write key depends on a read");
        let keys = block_on(discover(&Chase, &req, &snap)).unwrap();
        assert_eq!(keys.reads, vec![RowKey::new(0, 0)]);
        assert_eq!(keys.writes, vec![RowKey::new(1, 7)], "reconnaissance followed the pointer");
        // The real run with an unchanged pointer stays inside the declared set.
        let mut acc = Direct(&snap);
        assert!(block_on(Chase.run(&req, &mut Ctx::with_declared(&mut acc, &keys))).is_ok());
        // The pointer moves between reconnaissance and execution: the run must abort.
        snap.0.borrow_mut().insert(RowKey::new(0, 0), Value::copy_from(&[9]));
        let mut acc = Direct(&snap);
        let r = block_on(Chase.run(&req, &mut Ctx::with_declared(&mut acc, &keys)));
        assert_eq!(r.err(), Some(Abort::ReconMismatch));
    }
}
