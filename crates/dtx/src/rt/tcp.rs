//! The `tcp` runtime: one process per node, one thread per worker, and each worker thread polls
//! its own sockets (mio), so a message never hops between threads on its way in or out.
//!
//! Worker `w` of node `n` listens on its own port. To reach another worker, a worker opens one
//! connection to it, writes a hello (`DTX1`, its node and worker id), then length-prefixed
//! frames, each carrying one batch of envelopes ([`crate::net::Batch`]). Connections are
//! one-directional: replies travel on the replier's own connection. A frame larger than
//! [`MAX_FRAME_BYTES`], a bad hello or a malformed batch closes that connection (logged); the
//! worker keeps serving every other one. Injected delay holds received packets until due.
//!
//! A worker that has a core of its own ([`TcpNet::set_spin_poll`]) polls its sockets without
//! blocking for a while before it sleeps in the kernel: replies usually arrive within a round
//! trip, and a sleep and wake-up per round trip cost a third of a worker's time at two nodes
//! (TPC-C at two nodes on two cores: 40-54k → 64-80k txn/s). Where workers share cores, spinning
//! takes the core from the worker that would answer (four nodes on two cores lost 20%).

use super::local::{run_quantum, Command, DelayQueue};
use super::{Clock, Executor, Worker, WorkerConfig};
use crate::net::{Addr, LatencyModel, Packet, MAX_FRAME_BYTES};
use anyhow::Context;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use parking_lot::Mutex;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const MAGIC: &[u8; 4] = b"DTX1";
const HELLO_LEN: usize = 8;
/// Bytes queued for one peer before we stop queueing (a peer that stopped reading).
const MAX_PENDING_BYTES: usize = 256 << 20;
/// How often a worker checks whether a peer it has a connection to now listens elsewhere.
const MOVED_PEER_CHECK: Duration = Duration::from_millis(200);

/// How long an idle worker with a core of its own polls its sockets without blocking before it
/// sleeps in the kernel.
pub const SPIN_POLL: Duration = Duration::from_micros(50);

/// What the orchestrating thread shares with a tcp worker thread.
pub struct TcpHandle {
    pub waker: Arc<Waker>,
    pub commands: Mutex<Vec<Command>>,
    pub stop: AtomicBool,
}

impl TcpHandle {
    pub fn push_command(&self, c: Command) {
        self.commands.lock().push(c);
        let _ = self.waker.wake();
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.wake();
    }
}

struct InConn {
    stream: TcpStream,
    buf: Vec<u8>,
    src: Option<Addr>,
}

struct OutConn {
    stream: TcpStream,
    /// Where it was opened to: `peers` may later send the worker elsewhere (a node taken over
    /// on another machine).
    peer: SocketAddr,
    pending: Vec<u8>,
    writable: bool,
}

enum Conn {
    In(InConn),
    Out(Addr, OutConn),
}

/// A worker's sockets.
pub struct TcpNet {
    poll: Poll,
    handle: Arc<TcpHandle>,
    listener: TcpListener,
    conns: Vec<Option<Conn>>,
    out_index: rustc_hash::FxHashMap<Addr, usize>,
    peers: Arc<dyn Fn(Addr) -> SocketAddr + Send + Sync>,
    latency: LatencyModel,
    me: Addr,
    /// See [`TcpNet::set_spin_poll`].
    spin_poll: Duration,
}

impl TcpNet {
    /// Bind this worker's port. `peers` maps a worker address to where it listens.
    pub fn bind(
        me: Addr,
        listen: SocketAddr,
        peers: Arc<dyn Fn(Addr) -> SocketAddr + Send + Sync>,
        latency: LatencyModel,
    ) -> anyhow::Result<Self> {
        let poll = Poll::new().context("cannot create a poller")?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).context("cannot create a waker")?);
        let mut listener =
            TcpListener::bind(listen).with_context(|| format!("worker {me}: cannot listen on {listen}"))?;
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
        let handle = Arc::new(TcpHandle { waker, commands: Mutex::new(Vec::new()), stop: AtomicBool::new(false) });
        Ok(TcpNet {
            poll,
            handle,
            listener,
            conns: Vec::new(),
            out_index: Default::default(),
            peers,
            latency,
            me,
            spin_poll: Duration::ZERO,
        })
    }

    /// Where this worker listens (the port the system chose, when bound to port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn handle(&self) -> Arc<TcpHandle> {
        self.handle.clone()
    }

    /// Make this thread's worker; its executor is woken through the poller. Its RPC ids start
    /// past those of every earlier incarnation of its node ([`rpc_id_base`]).
    pub fn make_worker(&self, epoch: Instant, workers_per_node: u16, cfg: &WorkerConfig) -> Rc<Worker> {
        let waker = self.handle.waker.clone();
        let exec = Executor::detached(Arc::new(move || {
            let _ = waker.wake();
        }));
        super::log::enter_lane(self.me.worker);
        let w = Rc::new(Worker::new(self.me, workers_per_node, Clock::Real(epoch), exec, cfg));
        w.start_rpc_ids_at(rpc_id_base());
        w
    }

    fn slot(&mut self, c: Conn) -> usize {
        match self.conns.iter().position(|c| c.is_none()) {
            Some(i) => {
                self.conns[i] = Some(c);
                i
            }
            None => {
                self.conns.push(Some(c));
                self.conns.len() - 1
            }
        }
    }

    fn close(&mut self, i: usize, why: &str) {
        if let Some(c) = self.conns[i].take() {
            match c {
                Conn::In(mut c) => {
                    let _ = self.poll.registry().deregister(&mut c.stream);
                    if !why.is_empty() {
                        super::log_warn(&format!("{}: closing connection from {:?}: {why}", self.me, c.src));
                    }
                }
                Conn::Out(a, mut c) => {
                    let _ = self.poll.registry().deregister(&mut c.stream);
                    self.out_index.remove(&a);
                    super::log_warn(&format!("{}: lost connection to {a}: {why}", self.me));
                }
            }
        }
    }

    fn close_quietly(&mut self, i: usize) {
        if let Some(Conn::Out(a, mut c)) = self.conns[i].take() {
            let _ = self.poll.registry().deregister(&mut c.stream);
            self.out_index.remove(&a);
        }
    }

    /// Queue a packet for its destination, connecting on first use.
    fn send(&mut self, p: Packet) {
        let i = match self.out_index.get(&p.dst) {
            Some(&i) => i,
            None => match self.connect(p.dst) {
                Ok(i) => i,
                Err(e) => {
                    super::log_warn(&format!("{}: cannot reach {}: {e:#}", self.me, p.dst));
                    return;
                }
            },
        };
        if let Some(Conn::Out(_, c)) = &mut self.conns[i] {
            if c.pending.len() + p.bytes.len() > MAX_PENDING_BYTES {
                super::log_warn(&format!("{}: {} is not reading; dropping a packet", self.me, p.dst));
                return;
            }
            c.pending.extend_from_slice(&(p.bytes.len() as u32).to_le_bytes());
            c.pending.extend_from_slice(&p.bytes);
        }
        self.flush(i);
    }

    /// Close the connections to workers that now listen at another address (a node another
    /// machine took over), so the next packet connects there. Without this, a connection to a
    /// machine that vanished without resetting it (power loss, a cut cable) would keep taking
    /// packets until the kernel gave up on it, minutes later. What was queued on it is dropped:
    /// its requests time out and are retried, as for any lost message.
    fn drop_moved_peers(&mut self) {
        let moved: Vec<(usize, Addr, SocketAddr, SocketAddr)> = self
            .conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c {
                Some(Conn::Out(dst, oc)) => {
                    let now = (self.peers)(*dst);
                    (now != oc.peer).then_some((i, *dst, oc.peer, now))
                }
                _ => None,
            })
            .collect();
        for (i, dst, was, now) in moved {
            super::log_warn(&format!("{}: {dst} moved from {was} to {now}; reconnecting", self.me));
            self.close_quietly(i);
        }
    }

    fn connect(&mut self, dst: Addr) -> anyhow::Result<usize> {
        let addr = (self.peers)(dst);
        let stream = self.connect_from_own_address(addr)?;
        stream.set_nodelay(true)?;
        let mut pending = Vec::with_capacity(64 << 10);
        pending.extend_from_slice(MAGIC);
        pending.extend_from_slice(&self.me.node.to_le_bytes());
        pending.extend_from_slice(&self.me.worker.to_le_bytes());
        let i = self.slot(Conn::Out(dst, OutConn { stream, peer: addr, pending, writable: false }));
        if let Some(Conn::Out(_, c)) = &mut self.conns[i] {
            self.poll.registry().register(&mut c.stream, Token(i + 2), Interest::READABLE | Interest::WRITABLE)?;
        }
        self.out_index.insert(dst, i);
        Ok(i)
    }

    /// A non-blocking connection to `addr` that leaves from the address this worker listens on
    /// (when it listens on one address, not on all): a peer, a log line and a firewall rule
    /// then see one address per host, which is what `--faults partition` cuts by.
    fn connect_from_own_address(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        let own = self.listener.local_addr()?.ip();
        if own.is_unspecified() || own.is_ipv4() != addr.is_ipv4() {
            return TcpStream::connect(addr);
        }
        let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
        socket.set_nonblocking(true)?;
        socket.bind(&SocketAddr::new(own, 0).into())?;
        match socket.connect(&addr.into()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(e),
        }
        Ok(TcpStream::from_std(socket.into()))
    }

    fn flush(&mut self, i: usize) {
        let Some(Conn::Out(_, c)) = &mut self.conns[i] else { return };
        if !c.writable {
            return;
        }
        let mut written = 0;
        let mut err = None;
        while written < c.pending.len() {
            match c.stream.write(&c.pending[written..]) {
                Ok(0) => {
                    err = Some("peer closed".to_string());
                    break;
                }
                Ok(n) => written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    c.writable = false;
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    err = Some(e.to_string());
                    break;
                }
            }
        }
        c.pending.drain(..written);
        if let Some(e) = err {
            self.close(i, &e);
        }
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let i = self.conns.iter().position(|c| c.is_none()).unwrap_or(self.conns.len());
                    if self.poll.registry().register(&mut stream, Token(i + 2), Interest::READABLE).is_ok() {
                        let j = self.slot(Conn::In(InConn { stream, buf: Vec::with_capacity(64 << 10), src: None }));
                        debug_assert_eq!(i, j);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) => {
                    super::log_warn(&format!("{}: accept failed: {e}", self.me));
                    return;
                }
            }
        }
    }

    /// Read what a connection has; complete frames go to `out`. Returns an error to close it.
    fn read(c: &mut InConn, out: &mut Vec<Packet>, me: Addr) -> Result<bool, String> {
        let mut chunk = [0u8; 64 << 10];
        let mut open = true;
        loop {
            match c.stream.read(&mut chunk) {
                Ok(0) => {
                    open = false;
                    break;
                }
                Ok(n) => c.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        let mut at = 0;
        if c.src.is_none() {
            if c.buf.len() < HELLO_LEN {
                return Ok(open);
            }
            if &c.buf[..4] != MAGIC {
                return Err("bad hello (not a dtx peer)".into());
            }
            let node = u16::from_le_bytes([c.buf[4], c.buf[5]]);
            let worker = u16::from_le_bytes([c.buf[6], c.buf[7]]);
            c.src = Some(Addr::new(node, worker));
            at = HELLO_LEN;
        }
        let src = c.src.ok_or("no hello")?;
        while c.buf.len() - at >= 4 {
            let len = u32::from_le_bytes([c.buf[at], c.buf[at + 1], c.buf[at + 2], c.buf[at + 3]]) as usize;
            if len > MAX_FRAME_BYTES {
                return Err(format!("frame of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte limit"));
            }
            if c.buf.len() - at - 4 < len {
                break;
            }
            out.push(Packet { src, dst: me, bytes: c.buf[at + 4..at + 4 + len].to_vec(), control: false });
            at += 4 + len;
        }
        c.buf.drain(..at);
        Ok(open)
    }

    /// Poll without blocking for up to `spin` before a wait would sleep in the kernel; zero (the
    /// default) never spins. Give a worker [`SPIN_POLL`] only if it has a core of its own.
    pub fn set_spin_poll(&mut self, spin: Duration) {
        self.spin_poll = spin;
    }

    /// Wait for socket events at most `timeout`, polling without blocking for the first
    /// `spin_poll` of it: a reply usually comes back within a round trip, and blocking costs a
    /// sleep and a wake-up per round trip. A command or a wake from another thread arrives as
    /// the waker's event, so the events alone say when to stop.
    fn poll_spinning(&mut self, events: &mut Events, timeout: Duration) -> std::io::Result<()> {
        let start = Instant::now();
        let spin = self.spin_poll.min(timeout);
        while start.elapsed() < spin {
            self.poll.poll(events, Some(Duration::ZERO))?;
            if !events.is_empty() {
                return Ok(());
            }
        }
        self.poll.poll(events, Some(timeout.saturating_sub(start.elapsed())))
    }

    /// Run the worker's event loop on this thread until stopped.
    pub fn run(mut self, w: &Rc<Worker>) {
        let mut events = Events::with_capacity(1024);
        let mut delayed = DelayQueue::default();
        // What this worker sends while `--fault-at delay` holds its server's messages back
        // ([`set_send_delay_us`]); one sender, so it leaves in the order it was sent. Under a
        // delay of control packets alone ([`Packet::control`]) they wait apart, holding nothing
        // else back.
        let mut held_out = DelayQueue::default();
        let mut held_control = DelayQueue::default();
        let mut out = Vec::new();
        let mut received = Vec::new();
        let mut next_moved_check = Instant::now() + MOVED_PEER_CHECK;
        while !self.handle.stop.load(Ordering::Acquire) {
            if Instant::now() >= next_moved_check {
                self.drop_moved_peers();
                next_moved_check = Instant::now() + MOVED_PEER_CHECK;
            }
            let commands: Vec<Command> = std::mem::take(&mut *self.handle.commands.lock());
            for c in commands {
                c();
            }
            let mut timeout = run_quantum(w, &mut delayed, &mut out);
            let now = w.now_ns();
            for held in [&mut held_out, &mut held_control] {
                while let Some(p) = held.pop_due(now) {
                    self.send(p);
                }
            }
            for p in out.drain(..) {
                let send_delay_ns = send_delay_ns(w.addr.worker, p.control);
                let apart = p.control && SEND_DELAY_CONTROL.load(Ordering::Relaxed);
                let held = if apart { &mut held_control } else { &mut held_out };
                // Behind held packets too, even once the delay is over: links stay FIFO (control
                // packets held by a control-only delay, among themselves).
                if send_delay_ns > 0 || held.next_due().is_some() {
                    held.hold(now + send_delay_ns, p);
                } else {
                    self.send(p);
                }
            }
            for due in [held_out.next_due(), held_control.next_due()].into_iter().flatten() {
                timeout = timeout.min(Duration::from_nanos(due.saturating_sub(now)));
            }
            if !self.handle.commands.lock().is_empty() {
                timeout = Duration::ZERO;
            }
            if let Err(e) = self.poll_spinning(&mut events, timeout) {
                if e.kind() != ErrorKind::Interrupted {
                    super::log_warn(&format!("{}: poll failed: {e}", self.me));
                }
                continue;
            }
            for ev in events.iter() {
                self.on_event(ev, &mut received);
            }
            self.deliver(w, &mut received, &mut delayed);
        }
    }

    /// One readiness event: accept a connection, read what arrived on one (into `received`),
    /// or write what waits for one, closing it when its peer went away.
    fn on_event(&mut self, ev: &mio::event::Event, received: &mut Vec<Packet>) {
        match ev.token() {
            LISTENER => self.accept(),
            WAKER => {}
            Token(t) => {
                let i = t - 2;
                match self.conns.get_mut(i) {
                    Some(Some(Conn::In(c))) => match Self::read(c, received, self.me) {
                        Ok(true) => {}
                        Ok(false) => self.close(i, ""),
                        Err(e) => self.close(i, &e),
                    },
                    Some(Some(Conn::Out(_, c))) => {
                        if ev.is_writable() {
                            c.writable = true;
                        }
                        if ev.is_error() || ev.is_read_closed() {
                            // A peer that stopped with nothing queued for it closed
                            // cleanly (the end of a run); anything else lost data.
                            if ev.is_error() || !c.pending.is_empty() {
                                let why = format!(
                                    "connection reset with {} bytes unsent ({:?})",
                                    c.pending.len(),
                                    c.stream.take_error()
                                );
                                self.close(i, &why);
                            } else {
                                self.close_quietly(i);
                            }
                        } else {
                            self.flush(i);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// Hand what arrived to the worker: after the sampled delay when links have one, else now;
    /// a malformed batch closes the connection it came on (its peer is broken).
    fn deliver(&mut self, w: &Rc<Worker>, received: &mut Vec<Packet>, delayed: &mut DelayQueue) {
        let (now, delay) = (w.now_ns(), !self.latency.is_zero());
        for p in received.drain(..) {
            if delay {
                let d = self.latency.sample_ns(p.src.node, p.dst.node, &mut *w.rng.borrow_mut());
                delayed.hold(now + d, p);
            } else if w.deliver(p.src, &p.bytes).is_err() {
                // A malformed batch: the peer is broken; drop its connection.
                if let Some(i) =
                    self.conns.iter().position(|c| matches!(c, Some(Conn::In(ic)) if ic.src == Some(p.src)))
                {
                    self.close(i, "malformed batch");
                }
            }
        }
    }
}

/// Extra delay of every packet this process's workers send, µs (`--fault-at delay`, set over
/// the server's control connection); 0: none.
static SEND_DELAY_US: AtomicU64 = AtomicU64::new(0);
/// The worker whose packets alone are delayed, or [`EVERY_WORKER`].
static SEND_DELAY_WORKER: AtomicU32 = AtomicU32::new(EVERY_WORKER);
const EVERY_WORKER: u32 = u32::MAX;
/// Only control packets ([`Packet::control`]) are delayed.
static SEND_DELAY_CONTROL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Hold every packet this process's workers send (or only worker `worker`'s, or only control
/// packets) `us` µs longer from now on (0: no longer).
pub fn set_send_delay_us(us: u64, worker: Option<u16>, control: bool) {
    SEND_DELAY_WORKER.store(worker.map_or(EVERY_WORKER, u32::from), Ordering::Relaxed);
    SEND_DELAY_CONTROL.store(control, Ordering::Relaxed);
    SEND_DELAY_US.store(us, Ordering::Relaxed);
}

/// The delay of a packet worker `worker` sends now (`control`: a control packet), ns.
fn send_delay_ns(worker: u16, control: bool) -> u64 {
    if SEND_DELAY_CONTROL.load(Ordering::Relaxed) && !control {
        return 0;
    }
    match SEND_DELAY_WORKER.load(Ordering::Relaxed) {
        EVERY_WORKER => SEND_DELAY_US.load(Ordering::Relaxed) * 1000,
        w if w == u32::from(worker) => SEND_DELAY_US.load(Ordering::Relaxed) * 1000,
        _ => 0,
    }
}

/// Where a new worker's RPC ids start: past every id an earlier incarnation of its node used
/// (a server killed and started again, or a node this process served, gave up and took over
/// again), since a peer's de-duplication table answers a reused id with the old request's reply
/// (a reply to another request: the soak read one key's list as another's). The time in ms
/// since the epoch shifted left by 24, or 2^24 past the last base this process handed out if
/// that is larger: an incarnation that ran for `d` ms would have to send more than 16 million
/// requests per ms of `d` from one worker to reach its successor's first id.
fn rpc_id_base() -> u64 {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let by_time = (super::system_us() / 1000).max(1) << 24;
    let previous = LAST
        .fetch_update(std::sync::atomic::Ordering::AcqRel, std::sync::atomic::Ordering::Acquire, |last| {
            Some(by_time.max(last + (1 << 24)))
        })
        .expect("the update always succeeds");
    by_time.max(previous + (1 << 24))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener as StdListener;

    /// Accept one connection within `limit`, or none.
    fn accepts_within(l: &StdListener, limit: Duration) -> bool {
        l.set_nonblocking(true).unwrap();
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if l.accept().is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// Workers made one after another in one process (a node given up and taken over again
    /// within a millisecond) number their RPCs in ranges of their own.
    #[test]
    fn each_new_worker_numbers_its_rpcs_past_the_last_one() {
        let bases: Vec<u64> = (0..4).map(|_| rpc_id_base()).collect();
        assert!(bases.windows(2).all(|b| b[1] >= b[0] + (1 << 24)), "{bases:?}");
    }

    #[test]
    fn a_peer_that_moves_is_reconnected_at_its_new_address() {
        // Two "machines" for worker (1, 0): the old one keeps its connection open and silent (a
        // vanished host resets nothing); the new one is where the routes now say it listens.
        let (old, new) = (StdListener::bind("127.0.0.1:0").unwrap(), StdListener::bind("127.0.0.1:0").unwrap());
        let at = Arc::new(Mutex::new(old.local_addr().unwrap()));
        let route = at.clone();
        let peers: Arc<dyn Fn(Addr) -> SocketAddr + Send + Sync> = Arc::new(move |_| *route.lock());
        let me = Addr::new(0, 0);
        let mut net = TcpNet::bind(me, "127.0.0.1:0".parse().unwrap(), peers, LatencyModel::default()).unwrap();
        let dst = Addr::new(1, 0);
        let packet = || Packet { src: me, dst, bytes: vec![1, 2, 3], control: false };
        net.send(packet());
        assert!(accepts_within(&old, Duration::from_secs(5)), "the first packet connects to the old address");
        net.drop_moved_peers();
        assert!(net.out_index.contains_key(&dst), "nothing moved: the connection stays");
        *at.lock() = new.local_addr().unwrap();
        net.drop_moved_peers();
        assert!(!net.out_index.contains_key(&dst), "the connection to the old address is closed");
        net.send(packet());
        assert!(accepts_within(&new, Duration::from_secs(5)), "the next packet connects to the new address");
        let i = net.out_index[&dst];
        assert!(matches!(&net.conns[i], Some(Conn::Out(_, c)) if c.peer == new.local_addr().unwrap()));
    }
}
