//! A lean Sent for load: N audio calls over as many connections as Sent's `max_sessions` needs, each
//! sending a 20 ms frame every 20 ms (spread over the period as real calls are, or all at once), and the
//! echo's round trip of every frame in an HDR histogram.
//!
//! It is not the [`Sim`](crate::Sim): no recorder, no model, no frame kept, so that it costs little beside
//! the agent it measures on the same two cores (its own CPU is in the report). Each frame's samples carry
//! its call, its sequence number and its send time; an echo is matched by those, so a frame that comes
//! back on another call's stream is counted misrouted and one that never comes back lost. It speaks only
//! what an echoing audio agent needs: the handshake, `connection.ready`, `session.start` (with a resume
//! token, as Sent sends it), `ping`, the audio, and `session.end` at the end.

use anyhow::{bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use sentdm_voice_agents::frames::{
    self, ConnectionReady, Frame, Party, Ping, Resume, SessionEnd, SessionStart, SessionStartAudio,
    SUBPROTOCOL,
};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// How the calls' frames are placed within each period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// Call `i` of `n` sends at `i/n` of the period, as independent calls do.
    Spread,
    /// Every call sends at the start of the period.
    Burst,
}

/// What one load run places.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Live audio calls.
    pub calls: usize,
    /// `max_sessions` of each connection's `connection.ready`: the agent needs `calls / max_sessions`
    /// connections, rounded up.
    pub max_sessions: usize,
    /// Hz of the calls' audio.
    pub sample_rate: u32,
    /// The period of a call's frames, and the audio in each.
    pub frame: Duration,
    /// How long the measurement lasts, once every call has echoed its first frame.
    pub measure: Duration,
    /// How the frames are placed in the period.
    pub pacing: Pacing,
    /// How long the agent may take to open its connections and echo every call's first frame.
    pub warm_within: Duration,
}

impl LoadSpec {
    /// `calls` calls of 16 kHz audio in 20 ms frames, spread, at most 250 per connection, measured for 5 s.
    pub fn new(calls: usize) -> LoadSpec {
        LoadSpec {
            calls,
            max_sessions: 250,
            sample_rate: 16_000,
            frame: Duration::from_millis(20),
            measure: Duration::from_secs(5),
            pacing: Pacing::Spread,
            warm_within: Duration::from_secs(30),
        }
    }

    /// The connections an agent needs to take every call.
    pub fn connections(&self) -> usize {
        self.calls.div_ceil(self.max_sessions.max(1))
    }

    fn samples_per_frame(&self) -> usize {
        (u128::from(self.sample_rate) * self.frame.as_micros() / 1_000_000) as usize
    }
}

/// What a load run measured.
#[derive(Debug)]
pub struct LoadReport {
    /// Calls started (`session.start` sent).
    pub started: usize,
    /// Connections the calls were placed on.
    pub connections: usize,
    /// Calls never started: no connection of the agent came for them.
    pub unplaced: usize,
    /// Calls that never echoed their first frame within [`LoadSpec::warm_within`].
    pub silent: usize,
    /// Frames sent within the measurement.
    pub sent: u64,
    /// Of those, echoed on their own call's stream.
    pub echoed: u64,
    /// Frames that came back on a stream not their call's, or on no known stream.
    pub misrouted: u64,
    /// Round trip of each echoed frame, in microseconds: queued for the socket to read back.
    pub latency: Histogram<u64>,
    /// The generator's own CPU time during the measurement.
    pub generator_cpu: Duration,
    /// The measurement's wall time.
    pub measured: Duration,
    /// Why the run ended early or a connection closed, if one did.
    pub failure: Option<String>,
}

impl LoadReport {
    /// Frames sent within the measurement and never echoed.
    pub fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.echoed)
    }
}

/// Where the run is, for whoever measures the agent beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Every call is live and has echoed once: the measurement starts now.
    Measuring,
    /// The measurement is over (late echoes are still counted for a moment).
    Done,
}

/// A lean Sent listening on loopback.
pub struct LoadSent {
    listener: TcpListener,
    url: String,
}

/// How long echoes of the last frames may take after the measurement.
const GRACE: Duration = Duration::from_secs(1);
/// The bytes of a frame's samples that say which frame it is: call, sequence, send time.
const TAG: usize = 16;

impl LoadSent {
    /// Listens on a free loopback port.
    pub async fn bind() -> Result<LoadSent> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("ws://{}{}", listener.local_addr()?, frames::CONNECT_PATH);
        Ok(LoadSent { listener, url })
    }

    /// The URL an agent connects to (any API key, any agent id).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Places `spec`'s calls on the connections the agent opens, measures, ends the calls and closes.
    /// `phase` is called as the measurement starts and ends.
    pub async fn run(self, spec: &LoadSpec, mut phase: impl FnMut(Phase)) -> Result<LoadReport> {
        let samples = spec.samples_per_frame();
        if samples * 2 < TAG {
            bail!("a frame of {samples} samples cannot carry its tag");
        }
        let base = Instant::now();
        let (close, closed) = watch::channel(false);
        let shared = Arc::new(Shared {
            base,
            measure_from: AtomicU64::new(u64::MAX),
            measure_until: AtomicU64::new(u64::MAX),
            warm: AtomicUsize::new(0),
            stop: AtomicU64::new(u64::MAX),
            closed,
        });
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        let mut placed = 0;
        let mut conns = 0;
        let deadline = base + spec.warm_within;
        while placed < spec.calls {
            let accepted = tokio::time::timeout_at(deadline.into(), self.listener.accept()).await;
            let Ok(Ok((stream, _))) = accepted else {
                break;
            };
            stream.set_nodelay(true)?;
            let Ok(socket) = handshake(stream).await else {
                continue;
            };
            let take = (spec.calls - placed).min(spec.max_sessions);
            let calls: Vec<u32> = (placed..placed + take).map(|c| c as u32).collect();
            placed += take;
            conns += 1;
            let conn = Conn {
                spec: spec.clone(),
                shared: shared.clone(),
                calls,
                samples,
            };
            let done = done_tx.clone();
            tokio::spawn(async move {
                let _ = done.send(conn.serve(socket).await);
            });
        }
        drop(done_tx);
        // Every call live and echoing, then a second for the agent to settle, before measuring.
        while shared.warm.load(Ordering::Relaxed) < placed && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let silent = placed - shared.warm.load(Ordering::Relaxed).min(placed);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let cpu_from = cpu_time(None);
        let from = Instant::now();
        shared
            .measure_from
            .store(shared.nanos(from), Ordering::Relaxed);
        phase(Phase::Measuring);
        tokio::time::sleep(spec.measure).await;
        let until = Instant::now();
        shared
            .measure_until
            .store(shared.nanos(until), Ordering::Relaxed);
        let cpu_until = cpu_time(None);
        phase(Phase::Done);
        tokio::time::sleep(GRACE).await;
        shared
            .stop
            .store(shared.nanos(Instant::now()), Ordering::Relaxed);
        // The calls end; a reader whose agent never closes stops waiting after a grace.
        tokio::time::sleep(GRACE).await;
        let _ = close.send(true);

        let mut report = LoadReport {
            started: placed,
            connections: conns,
            unplaced: spec.calls - placed,
            silent,
            sent: 0,
            echoed: 0,
            misrouted: 0,
            latency: histogram(),
            generator_cpu: cpu_until
                .zip(cpu_from)
                .map_or(Duration::ZERO, |(b, a)| b.saturating_sub(a)),
            measured: until - from,
            failure: None,
        };
        while let Some(counts) = done_rx.recv().await {
            report.sent += counts.sent;
            report.echoed += counts.echoed;
            report.misrouted += counts.misrouted;
            report.latency.add(&counts.latency)?;
            report.failure = report.failure.or(counts.failure);
        }
        Ok(report)
    }
}

/// What every connection's tasks read: the clock's origin and the measurement's bounds (nanoseconds
/// since `base`; `u64::MAX` while unset).
struct Shared {
    base: Instant,
    measure_from: AtomicU64,
    measure_until: AtomicU64,
    /// Calls that have echoed their first frame.
    warm: AtomicUsize,
    /// When the connections end their calls and close.
    stop: AtomicU64,
    /// Turns true when the readers stop waiting for the agent's close.
    closed: watch::Receiver<bool>,
}

impl Shared {
    fn nanos(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_nanos() as u64
    }

    fn measured(&self, sent: u64) -> bool {
        sent >= self.measure_from.load(Ordering::Relaxed)
            && sent < self.measure_until.load(Ordering::Relaxed)
    }

    fn stopped(&self, now: Instant) -> bool {
        self.nanos(now) >= self.stop.load(Ordering::Relaxed)
    }
}

/// One connection's counts.
struct Counts {
    sent: u64,
    echoed: u64,
    misrouted: u64,
    latency: Histogram<u64>,
    failure: Option<String>,
}

/// One connection of the agent and the calls placed on it (stream `i + 1` is `calls[i]`).
struct Conn {
    spec: LoadSpec,
    shared: Arc<Shared>,
    calls: Vec<u32>,
    samples: usize,
}

type Socket = WebSocketStream<TcpStream>;

async fn handshake(stream: TcpStream) -> Result<Socket> {
    // tungstenite's callback type: its error is a whole response.
    #[allow(clippy::result_large_err)]
    let callback = |request: &Request, mut response: Response| -> Result<Response, ErrorResponse> {
        let offered = request
            .headers()
            .get("Sec-WebSocket-Protocol")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').any(|p| p.trim() == SUBPROTOCOL));
        if offered {
            response.headers_mut().insert(
                "Sec-WebSocket-Protocol",
                HeaderValue::from_static(SUBPROTOCOL),
            );
        }
        Ok(response)
    };
    // A read buffer for voice frames: tungstenite zero-fills its free part before every read, at the
    // default 128 KiB the largest cost of the generator's reading.
    let config = WebSocketConfig::default().read_buffer_size(8 << 10);
    Ok(tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(config)).await?)
}

impl Conn {
    async fn serve(self, socket: Socket) -> Counts {
        let (mut sink, mut stream) = socket.split();
        let shared = self.shared.clone();
        let calls = self.calls.clone();
        let reader = tokio::spawn(async move { read(&shared, &calls, &mut stream).await });
        let sent = self.write(&mut sink).await;
        let _ = sink.close().await;
        let mut counts = match reader.await {
            Ok(counts) => counts,
            Err(error) => Counts {
                failure: Some(format!("the reader stopped: {error}")),
                ..Counts::new()
            },
        };
        // The writer's error is the cause when both failed: the reader only saw the close after it.
        match sent {
            Ok(sent) => counts.sent = sent,
            Err(error) => counts.failure = Some(format!("writing: {error:#}")),
        }
        counts
    }

    /// Starts the calls, then sends each call's frames on its beat until told to stop; returns the frames
    /// sent within the measurement.
    async fn write(
        &self,
        sink: &mut futures_util::stream::SplitSink<Socket, Message>,
    ) -> Result<u64> {
        let text = |frame: Frame| {
            frames::encode_to_string(&frame)
                .map(|text| Message::Text(text.into()))
                .context("encoding")
        };
        sink.feed(text(Frame::ConnectionReady(ConnectionReady {
            protocol_version: "0.2.0".into(),
            heartbeat_interval_ms: HEARTBEAT.as_millis() as i64,
            max_sessions: self.spec.max_sessions as i64,
        }))?)
        .await?;
        for (i, call) in self.calls.iter().enumerate() {
            sink.feed(text(start(*call, i as u16 + 1, self.spec.sample_rate))?)
                .await?;
        }
        sink.flush().await?;

        // Each call's beat within the period, in the order they fall due.
        let period = self.spec.frame;
        let n = self.spec.calls.max(1) as u128;
        let mut beats: Vec<(Duration, usize)> = self
            .calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                let phase = match self.spec.pacing {
                    Pacing::Spread => period.as_nanos() * u128::from(*call) / n,
                    Pacing::Burst => 0,
                };
                (Duration::from_nanos(phase as u64), i)
            })
            .collect();
        beats.sort();
        let started = Instant::now();
        let mut seqs = vec![0u32; self.calls.len()];
        let mut sent = 0u64;
        let mut next_ping = started + HEARTBEAT;
        let mut cycle = 0u32;
        loop {
            let cycle_start = started + period * cycle;
            cycle += 1;
            for (phase, i) in &beats {
                let due = cycle_start + *phase;
                if due > Instant::now() {
                    // What is due now goes in one write; then wait for the next beat.
                    sink.flush().await?;
                    tokio::time::sleep_until(due.into()).await;
                }
                let now = Instant::now();
                if self.shared.stopped(now) {
                    return self.end(sink, sent).await;
                }
                let at = self.shared.nanos(now);
                let message = audio(*i as u16 + 1, self.calls[*i], seqs[*i], at, self.samples);
                seqs[*i] += 1;
                sent += u64::from(self.shared.measured(at));
                sink.feed(Message::Binary(message.into())).await?;
            }
            if Instant::now() >= next_ping {
                next_ping += HEARTBEAT;
                let ts = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                sink.feed(text(Frame::Ping(Ping { ts }))?).await?;
            }
        }
    }

    async fn end(
        &self,
        sink: &mut futures_util::stream::SplitSink<Socket, Message>,
        sent: u64,
    ) -> Result<u64> {
        for call in &self.calls {
            let end = Frame::SessionEnd(SessionEnd {
                session_id: session_id(*call),
                reason: "hangup".into(),
                duration_ms: 0,
            });
            sink.feed(Message::Text(frames::encode_to_string(&end)?.into()))
                .await?;
        }
        sink.flush().await?;
        Ok(sent)
    }
}

/// How often Sent pings, as `connection.ready` says.
const HEARTBEAT: Duration = Duration::from_secs(15);

fn session_id(call: u32) -> String {
    format!("vs_load-{call}")
}

fn start(call: u32, stream: u16, sample_rate: u32) -> Frame {
    Frame::SessionStart(SessionStart {
        session_id: session_id(call),
        call_id: format!("call_load-{call}"),
        agent_id: "agent_load".into(),
        direction: "inbound".into(),
        from: Party {
            kind: "number".into(),
            value: Some("+14155550100".into()),
        },
        to: Party {
            kind: "agent".into(),
            value: Some("agent_load".into()),
        },
        session_type: "audio".into(),
        language: Some("en-US".into()),
        audio: Some(SessionStartAudio {
            stream: i64::from(stream),
            sample_rate: Some(i64::from(sample_rate)),
        }),
        max_duration_ms: Some(1_800_000),
        context: None,
        resume: Some(Resume {
            token: format!("vsr_load-{call:020}"),
            window_ms: 30_000,
        }),
        started_at: "2026-12-02T00:00:00Z".into(),
    })
}

/// A binary audio message on `stream` whose samples start with the frame's tag.
fn audio(stream: u16, call: u32, seq: u32, at: u64, samples: usize) -> Vec<u8> {
    let mut message = vec![0u8; 2 + samples * 2];
    message[..2].copy_from_slice(&stream.to_be_bytes());
    message[2..6].copy_from_slice(&call.to_le_bytes());
    message[6..10].copy_from_slice(&seq.to_le_bytes());
    message[10..18].copy_from_slice(&at.to_le_bytes());
    message
}

/// Reads the agent's messages until the connection closes or the run stops, matching echoes.
async fn read(
    shared: &Shared,
    calls: &[u32],
    stream: &mut futures_util::stream::SplitStream<Socket>,
) -> Counts {
    let mut counts = Counts::new();
    let mut warm = vec![false; calls.len()];
    let mut closed = shared.closed.clone();
    loop {
        let message = tokio::select! {
            biased;
            message = stream.next() => message,
            _ = closed.changed() => break,
        };
        let Some(message) = message else { break };
        let now = Instant::now();
        let data = match message {
            Ok(Message::Binary(data)) => data,
            Ok(Message::Close(_)) => break,
            Ok(_) => continue,
            Err(error) => {
                if !shared.stopped(now) {
                    counts.failure = Some(format!("reading: {error}"));
                }
                break;
            }
        };
        let tag = (data.len() >= 2 + TAG).then(|| {
            let stream = u16::from_be_bytes([data[0], data[1]]) as usize;
            let call = u32::from_le_bytes(data[2..6].try_into().unwrap_or_default());
            let at = u64::from_le_bytes(data[10..18].try_into().unwrap_or_default());
            (stream, call, at)
        });
        let Some((stream, call, at)) = tag else {
            counts.misrouted += 1;
            continue;
        };
        let Some(index) = stream
            .checked_sub(1)
            .filter(|i| calls.get(*i) == Some(&call))
        else {
            counts.misrouted += 1;
            continue;
        };
        if !warm[index] {
            warm[index] = true;
            shared.warm.fetch_add(1, Ordering::Relaxed);
        }
        if shared.measured(at) {
            counts.echoed += 1;
            let micros = shared.nanos(now).saturating_sub(at) / 1_000;
            counts.latency.saturating_record(micros.max(1));
        }
    }
    if counts.failure.is_none() && !shared.stopped(Instant::now()) {
        counts.failure = Some("the agent closed the connection".into());
    }
    counts
}

impl Counts {
    fn new() -> Counts {
        Counts {
            sent: 0,
            echoed: 0,
            misrouted: 0,
            latency: histogram(),
            failure: None,
        }
    }
}

/// Microseconds from 1 µs to a minute, to three significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("bounds within hdrhistogram's range")
}

/// A process's CPU time (user and system) from `/proc`: this process's, or `pid`'s.
pub fn cpu_time(pid: Option<u32>) -> Option<Duration> {
    let stat = std::fs::read_to_string(proc_path(pid, "stat")).ok()?;
    // The fields after the command's closing parenthesis; utime and stime are the 14th and 15th of all.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on Linux for every architecture it reports in `stat`.
    Some(Duration::from_millis(ticks * 10))
}

/// A process's resident memory (`VmRSS`) in bytes: this process's, or `pid`'s.
pub fn rss_bytes(pid: Option<u32>) -> Option<u64> {
    let status = std::fs::read_to_string(proc_path(pid, "status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn proc_path(pid: Option<u32>, file: &str) -> String {
    match pid {
        Some(pid) => format!("/proc/{pid}/{file}"),
        None => format!("/proc/self/{file}"),
    }
}
