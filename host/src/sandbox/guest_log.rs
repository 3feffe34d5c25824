//! The guest's log: the `log` import, stdout and stderr, as lines through one rate limit per call.

use super::wit::Level;
use super::GuestImports;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

/// The guest's log: lines from the `log` import, stdout and stderr go to the call's log through one per-call
/// rate limit; lines over it are dropped and counted. A line is cut at [`MAX_LINE`] bytes.
#[derive(Clone)]
pub(super) struct GuestOutput {
    shared: Arc<OutputShared>,
}

struct OutputShared {
    imports: Arc<dyn GuestImports>,
    per_second: u32,
    state: Mutex<OutputState>,
    warned: AtomicBool,
}

struct OutputState {
    line: Vec<u8>,
    window: Instant,
    lines: u32,
}

impl GuestOutput {
    /// The log of the call behind `imports`, `per_second` lines a second at most.
    pub(super) fn new(imports: Arc<dyn GuestImports>, per_second: u32) -> GuestOutput {
        GuestOutput {
            shared: Arc::new(OutputShared {
                imports,
                per_second,
                state: Mutex::new(OutputState {
                    line: Vec::new(),
                    window: Instant::now(),
                    lines: 0,
                }),
                warned: AtomicBool::new(false),
            }),
        }
    }
}

/// The longest guest log line kept, in bytes; the longest text of a guest's the host logs anywhere (a
/// handler's error, a trap's cause).
pub const MAX_LINE: usize = 1024;

/// `text` cut to at most [`MAX_LINE`] bytes, on a character boundary.
pub fn clip(text: &str) -> &str {
    clip_to(text, MAX_LINE)
}

/// `text` cut to at most `most` bytes, on a character boundary.
pub fn clip_to(text: &str, most: usize) -> &str {
    let mut cut = text.len().min(most);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[..cut]
}

impl GuestOutput {
    /// Whether a line the host logs because of the guest (a handler's error) has room in the call's
    /// rate; counted as one of the guest's lines either way.
    pub(super) fn admit(&self) -> bool {
        let mut state = self.shared.lock();
        self.shared.admit(&mut state)
    }

    /// A line from the `log` import.
    pub(super) fn log(&self, level: Level, message: &str) {
        let mut state = self.shared.lock();
        self.shared.emit(&mut state, level, clip(message));
    }
}

impl OutputShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, OutputState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes written to stdout or stderr, split into lines.
    fn write(&self, bytes: &[u8]) {
        let mut state = self.lock();
        for &byte in bytes {
            if byte == b'\n' || state.line.len() >= MAX_LINE {
                let line = String::from_utf8_lossy(&state.line).into_owned();
                state.line.clear();
                self.emit(&mut state, Level::Info, &line);
                if byte == b'\n' {
                    continue;
                }
            }
            state.line.push(byte);
        }
    }

    /// One line, if the second it falls in has room for it.
    fn emit(&self, state: &mut OutputState, level: Level, line: &str) {
        if self.admit(state) {
            self.imports.log(level, line);
        }
    }

    /// Whether the second a line falls in has room for it; counts it if so, else counts it dropped.
    fn admit(&self, state: &mut OutputState) -> bool {
        if state.window.elapsed() >= Duration::from_secs(1) {
            state.window = Instant::now();
            state.lines = 0;
        }
        state.lines += 1;
        if state.lines <= self.per_second {
            return true;
        }
        self.imports.log_dropped();
        if !self.warned.swap(true, Ordering::Relaxed) {
            self.imports
                .log(Level::Warn, "guest log over its rate limit: dropping lines");
        }
        false
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.shared.write(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
