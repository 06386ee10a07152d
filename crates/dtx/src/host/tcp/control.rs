//! The bench's side of a server's control connection: requests, their time limits, and waiting
//! for a run that survives its server's restarts.

use super::*;

/// How long the bench waits for a node whose server died mid-run to come back.
pub(super) const RESTART_PATIENCE: Duration = Duration::from_secs(60);

/// How long a server waits, past the run's window, for its clients to finish.
pub(super) const CLIENTS_PATIENCE: Duration = Duration::from_secs(120);

/// Wait for a node's run to end. If its server dies meanwhile (killed, crashed) and comes back
/// on the same address with its `--data-dir`, it takes the run up again from its log and its
/// history file: reconnect and ask again. Also returns when the bench lost the server (ms since
/// the Unix epoch), to time a takeover of its node.
/// A server's control connection, its final report, and when it was lost (Unix ms), if it was.
pub(super) type Waited = (Control, WaitReply, Option<u64>);

/// A server's answer to `wait`: what its node did in the run. Typed on both ends and written
/// straight to the socket: as a `serde_json::Value` a history of a million transactions takes
/// several times its JSON's size in memory, on the server and again in the bench.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct WaitReply {
    pub ok: bool,
    /// Why not, when `ok` is false.
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub totals: Totals,
    #[serde(default)]
    pub history: Vec<HistLine>,
    /// Clients still running when the server stopped waiting for them.
    #[serde(default)]
    pub stuck_workers: u64,
    /// The server restarted during the run and answers from its history file.
    #[serde(default)]
    pub resumed: bool,
    /// Whether the server serves a node now (not if its node was taken over).
    #[serde(default)]
    pub serves: bool,
    #[serde(default)]
    pub takeovers: Vec<Takeover>,
    /// As the window closed: where this server's replicas had applied their logs to and where
    /// its nodes released results ([`crate::host::tcp_host::Hosting::replay_points_us`]).
    #[serde(default)]
    pub replay_points_us: Vec<u64>,
}

/// Gives up, naming the wait, once `deadline` passes: the run's window, the servers' own
/// patience with their clients ([`CLIENTS_PATIENCE`]) and [`ANSWER_MARGIN`].
pub(super) fn wait_surviving_restarts(mut c: Control, addr: SocketAddr, deadline: Instant) -> anyhow::Result<Waited> {
    let mut lost_unix_ms = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match c.call_line_within(&json!({"cmd": "wait"}), left).and_then(|line| c.wait_reply(&line)) {
            Ok(reply) => return Ok((c, reply, lost_unix_ms)),
            Err(e) if c.lost && !left.is_zero() => {
                lost_unix_ms.get_or_insert_with(crate::host::tcp_host::unix_ms);
                eprintln!("dtx: node {}: {e:#}; waiting up to {:?} for it to restart", c.node, RESTART_PATIENCE);
                c = Control::connect(c.node, addr, RESTART_PATIENCE.min(left))?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// How long a server waits for its final read to commit, and for its final checks.
pub(super) const FINAL_READ_WAIT: Duration = Duration::from_secs(60);
pub(super) const FINAL_CHECKS_WAIT: Duration = Duration::from_secs(600);

/// How long the bench waits for a server's answer beyond what the server itself waits for:
/// a server that does not answer by then (stopped, hung) is given up on, by name.
pub(super) const ANSWER_MARGIN: Duration = Duration::from_secs(30);

/// How long the bench waits for a server's answer to `cmd` (`wait` is bounded by the run's
/// window instead, see [`wait_surviving_restarts`]).
pub(super) fn patience(cmd: &str) -> Duration {
    match cmd {
        // Loading a large TPC-C or YCSB population.
        "prepare" => Duration::from_secs(600),
        "final_read" => FINAL_READ_WAIT + ANSWER_MARGIN,
        "final_checks" => FINAL_CHECKS_WAIT + ANSWER_MARGIN,
        _ => ANSWER_MARGIN,
    }
}

/// A control connection to one node.
pub(super) struct Control {
    pub(super) node: usize,
    pub(super) reader: BufReader<TcpStream>,
    pub(super) writer: TcpStream,
    /// The connection broke (the server died), as opposed to the server refusing a request.
    pub(super) lost: bool,
    /// The server did not answer within the bench's patience: the connection is given up (a
    /// late answer would be read as the next request's).
    pub(super) timed_out: bool,
}

impl Control {
    pub(super) fn connect(node: usize, addr: SocketAddr, patience: Duration) -> anyhow::Result<Self> {
        let t0 = Instant::now();
        loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    return Ok(Control {
                        node,
                        reader: BufReader::new(s.try_clone()?),
                        writer: s,
                        lost: false,
                        timed_out: false,
                    });
                }
                Err(e) if t0.elapsed() < patience => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => bail!("cannot reach node {node} at {addr}: {e} (is `dtx server` running there?)"),
            }
        }
    }

    /// Send `req` and read the answer, waiting at most the request's [`patience`].
    pub(super) fn call(&mut self, req: &Value) -> anyhow::Result<Value> {
        let limit = patience(req["cmd"].as_str().unwrap_or(""));
        self.call_within(req, limit)
    }

    /// Send `req` and read the answer, waiting at most `limit` for it.
    pub(super) fn call_within(&mut self, req: &Value, limit: Duration) -> anyhow::Result<Value> {
        let line = self.call_line_within(req, limit)?;
        let v: Value = serde_json::from_str(&line).with_context(|| format!("node {}: unreadable reply", self.node))?;
        if v["ok"] != json!(true) {
            bail!("node {}: {}", self.node, v["error"].as_str().unwrap_or("error"));
        }
        Ok(v)
    }

    /// A `wait` answer, read into its own type.
    fn wait_reply(&self, line: &str) -> anyhow::Result<WaitReply> {
        let reply: WaitReply =
            serde_json::from_str(line).with_context(|| format!("node {}: unreadable reply to wait", self.node))?;
        if !reply.ok {
            bail!("node {}: {}", self.node, reply.error.as_deref().unwrap_or("error"));
        }
        Ok(reply)
    }

    /// Send `req` and read the answer's line, waiting at most `limit` for it.
    fn call_line_within(&mut self, req: &Value, limit: Duration) -> anyhow::Result<String> {
        let node = self.node;
        let what = match req["cmd"].as_str().unwrap_or("") {
            "wait" => format!("node {node}'s clients to finish (the end of its run)"),
            "ping" => format!("node {node} to answer a ping"),
            other => format!("node {node}'s {}", other.replace('_', " ")),
        };
        if self.timed_out {
            bail!("node {}: its control connection was given up on (an earlier request timed out)", self.node);
        }
        let mut line = String::new();
        let mut bytes = serde_json::to_vec(req)?;
        bytes.push(b'\n');
        self.writer.set_read_timeout(Some(limit.max(Duration::from_millis(1))))?;
        let sent = self.writer.write_all(&bytes).and_then(|_| self.reader.read_line(&mut line));
        match sent {
            Ok(0) => {
                self.lost = true;
                bail!("node {} closed the control connection", self.node);
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                self.timed_out = true;
                bail!("gave up waiting {} s for {what}: its server did not answer", limit.as_secs());
            }
            Err(e) => {
                self.lost = true;
                bail!("node {}: the control connection broke: {e}", self.node);
            }
            Ok(_) => {}
        }
        Ok(line)
    }
}
