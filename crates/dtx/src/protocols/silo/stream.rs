//! How committed transactions reach their streams and how results are released: Rolis's
//! replicate step (§3.2-§3.4), and with a local log SiloR's logging.
//!
//! - `streams=per-worker`: each worker batches its transactions' write sets and appends a batch
//!   to a log of its own once it holds `batch` transactions or every `flush_us`, and a
//!   heartbeat when it has nothing to log. When an entry is durable, the worker reports its
//!   TID as its stream's tip; every `watermark_us` worker 0 takes the minimum over the streams
//!   (the watermark) and releases every commit at or below it.
//! - `streams=shared`: every worker appends each transaction to one log under its locks, and a
//!   commit is released once its record is durable (Rolis's strawman, §2.2).

use super::log::{Entry, Logged};
use super::SiloConfig;
use crate::replication::watermark::StreamWatermark;
use crate::rt::log::NodeLog;
use crate::rt::release::{AckSource, ReleasePoints};
use crate::rt::Worker;
use parking_lot::Mutex;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

/// A log entry holds at most this many bytes of writes: a batch that a transaction would take
/// past it is appended first, and a transaction larger alone is refused (`log-refused`). An
/// entry then fits a replicated log's entry limit (1 MiB, `RaftConfig::max_size_per_msg`) and
/// the WAL's record limit. (The sizes are estimates above the encoded ones.)
pub const ENTRY_BYTES: usize = 900 << 10;

/// A node's streams.
pub struct Streams {
    pub logs: Vec<Arc<NodeLog>>,
    pub cfg: SiloConfig,
    /// Per-worker streams: each one's latest durable TID, in this incarnation's epoch.
    watermark: Mutex<StreamWatermark>,
    points: Arc<ReleasePoints>,
}

/// Where a commit waits before its client hears of it.
pub enum Release {
    /// Nothing to wait for.
    Now,
    /// A point of the node's [`Streams::ack_source`].
    At(u64),
}

impl Streams {
    pub fn new(logs: Vec<Arc<NodeLog>>, cfg: SiloConfig, epoch: u64) -> Self {
        let watermark = Mutex::new(StreamWatermark::new(logs.len(), epoch));
        Streams { logs, cfg, watermark, points: ReleasePoints::new() }
    }

    pub fn ack_source(&self) -> Arc<dyn AckSource> {
        match self.cfg.shared_stream {
            true => self.logs[0].clone(),
            false => self.points.clone(),
        }
    }

    /// A read-only transaction that read TIDs up to `floor`: released once every write it
    /// read is (it logs nothing). `first` is this epoch's first TID: what lies below it was
    /// recovered, and is safe.
    pub fn read_only(&self, floor: u64, first: u64) -> Release {
        match self.cfg.shared_stream {
            true => self.logs[0].read_fence().map_or(Release::Now, Release::At),
            false if floor < first => Release::Now,
            false => Release::At(floor),
        }
    }

    /// Append `entry` to stream `stream`; with `tip`, report it once durable. `bytes` bounds
    /// its encoding (`logged_bytes`), so that a batch is encoded into one buffer of its size,
    /// which the log keeps, rather than one grown by doubling and then copied.
    fn append(
        &self,
        w: &Rc<Worker>,
        s: &Arc<Self>,
        stream: usize,
        entry: &Entry,
        bytes: usize,
        tip: Option<u64>,
    ) -> u64 {
        let log = &self.logs[stream];
        let record =
            postcard::to_extend(entry, Vec::with_capacity(bytes)).expect("postcard encoding of an in-memory entry");
        // A batch is cut far below the record limit, and a transaction that would not fit
        // alone was refused before it installed (`fits`).
        let lsn = log.append_owned(record).expect("a stream entry within the log's record limit");
        if let Some(tid) = tip {
            let (s, log) = (s.clone(), log.clone());
            w.spawn(async move {
                log.wait(lsn).await;
                s.watermark.lock().report(stream, tid);
            });
        }
        lsn
    }

    /// The watermark the leader released through, in the TIDs' clock (µs): per-worker streams
    /// only, once it released anything (a shared stream releases by log position).
    pub fn released_watermark_us(&self) -> Option<u64> {
        let released = self.points.released_through();
        (!self.cfg.shared_stream && released > 0).then(|| super::meta::clock_us_of(released))
    }

    /// Every `watermark_us`: release every commit at or below the watermark (an entry at a
    /// stream's tip is durable, so the watermark's own is too). Runs on worker 0.
    pub async fn release_loop(self: Arc<Self>, w: Rc<Worker>) {
        loop {
            w.sleep_us(self.cfg.watermark_us).await;
            let watermark = self.watermark.lock().watermark();
            if watermark > 0 {
                self.points.release_through(watermark);
            }
        }
    }
}

/// The most an entry's own fields take, encoded (a tag and two varints).
const SMALL_ENTRY_BYTES: usize = 24;

/// What a worker holds for its stream.
pub struct WorkerStream {
    batch: Vec<Logged>,
    bytes: usize,
    /// Epochs closed at this incarnation's start, not logged in this stream yet.
    closes: Vec<(u64, u64)>,
}

/// The bytes a transaction's writes take in a batch, at most (postcard: a TID, and per write a
/// key of at most 13 bytes, an option tag and a length of at most 5).
pub fn logged_bytes(writes: &[(crate::storage::RowKey, Option<crate::storage::Value>)]) -> usize {
    16 + writes.iter().map(|(_, v)| 24 + v.as_ref().map_or(0, |v| v.len())).sum::<usize>()
}

/// Whether a transaction with these writes fits one log entry.
pub fn fits(bytes: usize) -> bool {
    bytes <= ENTRY_BYTES
}

impl WorkerStream {
    pub fn new(closes: Vec<(u64, u64)>) -> Self {
        WorkerStream { batch: Vec::new(), bytes: 0, closes }
    }

    /// Log transaction `tid` (its locks still held): into the worker's batch, cut when full;
    /// into the shared stream at once. Returns where its release waits.
    pub fn log(
        me: &RefCell<WorkerStream>,
        w: &Rc<Worker>,
        s: &Arc<Streams>,
        tid: u64,
        writes: crate::protocols::twopc::durable::Writes,
    ) -> Release {
        if s.cfg.shared_stream {
            let bytes = logged_bytes(&writes) + SMALL_ENTRY_BYTES;
            let entry = Entry::Batch { released: 0, txns: vec![(tid, writes)] };
            return Release::At(s.append(w, s, 0, &entry, bytes, None));
        }
        let bytes = logged_bytes(&writes);
        if me.borrow().bytes + bytes > ENTRY_BYTES {
            Self::flush(me, w, s);
        }
        let full = {
            let mut st = me.borrow_mut();
            st.bytes += bytes;
            st.batch.push((tid, writes));
            st.batch.len() >= s.cfg.batch
        };
        if full {
            Self::flush(me, w, s);
        }
        Release::At(tid)
    }

    /// Append the batch to the worker's stream, if it holds anything. Returns whether it did.
    pub fn flush(me: &RefCell<WorkerStream>, w: &Rc<Worker>, s: &Arc<Streams>) -> bool {
        Self::close_old_epochs(me, w, s);
        let (txns, bytes) = {
            let mut st = me.borrow_mut();
            (std::mem::take(&mut st.batch), std::mem::take(&mut st.bytes))
        };
        let Some(&(last, _)) = txns.last() else { return false };
        w.count("batches", 1);
        let entry = Entry::Batch { released: s.points.released_through(), txns };
        s.append(w, s, w.addr.worker as usize, &entry, bytes + SMALL_ENTRY_BYTES, Some(last));
        true
    }

    /// Log the epochs this incarnation closed, with their final watermarks, unless done: a
    /// stream's first entries in an incarnation, so that a replica replays the old epochs up
    /// to their watermarks before it sees anything of the new one.
    fn close_old_epochs(me: &RefCell<WorkerStream>, w: &Rc<Worker>, s: &Arc<Streams>) {
        let closes = std::mem::take(&mut me.borrow_mut().closes);
        for (epoch, last) in closes {
            s.append(w, s, w.addr.worker as usize, &Entry::Closed { epoch, last }, SMALL_ENTRY_BYTES, None);
        }
    }

    /// An idle stream's heartbeat at `tid`, a TID the worker took after everything it logged.
    pub fn heartbeat(me: &RefCell<WorkerStream>, w: &Rc<Worker>, s: &Arc<Streams>, tid: u64) {
        Self::close_old_epochs(me, w, s);
        let entry = Entry::Heartbeat { released: s.points.released_through(), tid };
        s.append(w, s, w.addr.worker as usize, &entry, SMALL_ENTRY_BYTES, Some(tid));
    }
}

#[cfg(test)]
mod calibration {
    use super::*;
    use crate::storage::{RowKey, Value};
    use std::time::Instant;

    /// A batch of `txns` transactions, each `writes` rows of `value_bytes`.
    fn batch(txns: u64, writes: u64, value_bytes: usize) -> Entry {
        let value = Value::copy_from(&vec![7u8; value_bytes]);
        let txns = (0..txns)
            .map(|t| {
                (t << 20, (0..writes).map(|k| (RowKey { table: 3, key: t * 64 + k }, Some(value.clone()))).collect())
            })
            .collect();
        Entry::Batch { released: 1 << 40, txns }
    }

    /// The least time over seven tries of `rounds` encodings of `entry` by `encode`, in ns per KiB.
    fn ns_per_kib(entry: &Entry, rounds: usize, encode: impl Fn(&Entry) -> Vec<u8>) -> f64 {
        (0..7)
            .map(|_| {
                let (mut bytes, t0) = (0, Instant::now());
                for _ in 0..rounds {
                    bytes += std::hint::black_box(encode(entry)).len();
                }
                t0.elapsed().as_nanos() as f64 / (bytes as f64 / 1024.0)
            })
            .fold(f64::MAX, f64::min)
    }

    #[test]
    #[ignore = "a measurement, not a test: run it to calibrate the simulator's charge per logged byte"]
    fn encode_cost_per_kib() {
        for (txns, writes, value_bytes) in [(1000, 12, 200), (1000, 4, 100), (50, 12, 200), (1, 12, 200)] {
            let entry = batch(txns, writes, value_bytes);
            let rounds = 5_000 / txns as usize + 5;
            let plain = ns_per_kib(&entry, rounds, crate::net::encode);
            let copied = ns_per_kib(&entry, rounds, |e| crate::net::encode(e).to_vec());
            let sized = ns_per_kib(&entry, rounds, |e| {
                let est = match e {
                    Entry::Batch { txns, .. } => txns.iter().map(|(_, w)| logged_bytes(w)).sum(),
                    _ => 64,
                };
                postcard::to_extend(e, Vec::with_capacity(est)).expect("encodes")
            });
            println!("{txns} txns of {writes} writes of {value_bytes} B: encode {plain:.0}, and a copy {copied:.0}, into a sized buffer {sized:.0} ns per KiB");
        }
    }
}
