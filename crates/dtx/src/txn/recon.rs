//! Reconnaissance (OLLP): run a procedure once against a snapshot, without concurrency control,
//! to learn the keys it will touch; the real one-shot run is then checked against that set.

use super::{Access, Ctx, KeySet, Scan, Step, TxnRequest, TxnResult};
use crate::rt::LocalBoxFuture;
use crate::storage::{RowKey, Value};
use crate::workloads::Workload;
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
        let reader = self.reader;
        Step::Wait(Box::pin(async move {
            let rows = reader.scan(scan).await?;
            Ok(rows)
        }))
    }
}

/// Discover the key set of `req` by running it against snapshot reads. Rows a scan returns are
/// added as reads by the procedure's own `read` calls, which is how our procedures use scans.
pub async fn discover(workload: &dyn Workload, req: &TxnRequest, reader: &dyn SnapshotReader) -> TxnResult<KeySet> {
    let mut acc = ReconAccess { reader, keys: KeySet::default(), written: FxHashMap::default() };
    {
        let mut ctx = Ctx::new(&mut acc);
        workload.run(req, &mut ctx).await?;
    }
    Ok(acc.keys)
}
