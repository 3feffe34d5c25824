//! The host's log: `RUST_LOG` directives, except that the libraries that see secrets on the wire are held
//! at `info` whatever they say (scenario `secrets_never_logged_at_trace`): tungstenite logs the upgrade
//! request (with the API key) and every frame (with resume tokens) at `trace`; rustls, hyper and h2 see
//! headers. What the host logs itself never carries a key or a token (see [`voicehost_proto::wire::loggable`]).
//! wasmtime-wasi-http is held at `error`: its warnings are one per failed request of a guest's (a bad URI,
//! a refused connection, a failed lookup), which the guest hears as an error code and the host counts,
//! so a guest could otherwise write the host's log as fast as it sends requests. And every event is one
//! line, whatever text it carries: a guest's text in a field cannot forge a line of the host's.

use tracing::level_filters::LevelFilter;
use tracing::{Level, Metadata};
use tracing_subscriber::filter::{filter_fn, EnvFilter, FilterExt};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// The log targets held at `info`.
pub const HELD_AT_INFO: [&str; 6] = [
    "tungstenite",
    "tokio_tungstenite",
    "rustls",
    "hyper",
    "hyper_util",
    "h2",
];

/// The log targets held at `error`: what a guest's requests make them log (see the module's comment).
pub const HELD_AT_ERROR: [&str; 1] = ["wasmtime_wasi_http"];

/// What `voicehost` logs without `RUST_LOG`: its own events from `info`, the engine's warnings.
pub const DEFAULT: &str = "info,wasmtime=warn,cranelift=warn";

/// Whether an event or span of `metadata` may be logged at all, whatever the directives say.
pub fn allowed(metadata: &Metadata<'_>) -> bool {
    let target = metadata.target();
    let held = |targets: &[&str]| {
        targets.iter().any(|held| {
            target
                .strip_prefix(held)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
        })
    };
    let most = if held(&HELD_AT_ERROR) {
        Level::ERROR
    } else if held(&HELD_AT_INFO) {
        Level::INFO
    } else {
        Level::TRACE
    };
    *metadata.level() <= most
}

/// `directives` (`RUST_LOG`'s syntax; `default` when they do not parse or are absent), with the held
/// targets capped at `info`.
///
/// The filter's most verbose level is the directives' own: a filter that states none lets every
/// `log::trace!` of Cranelift, regalloc2, wasmtime and tungstenite through to the filter, one call each
/// (compiling a 12 MB component took 5 times as long in the tests' unoptimised build, 15 % in release).
pub fn filter<S>(directives: Option<&str>, default: &str) -> impl Filter<S> + Send + Sync + 'static
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let env = directives
        .and_then(|d| EnvFilter::try_new(d).ok())
        .unwrap_or_else(|| EnvFilter::new(default));
    // `And` states the lesser of its two levels, and none if either states none.
    env.and(filter_fn(allowed).with_max_level_hint(LevelFilter::TRACE))
}

/// Logs to stderr as `RUST_LOG` says (`default` without it), plain text unless stderr is a terminal.
pub fn init(default: &str) {
    let directives = std::env::var("RUST_LOG").ok();
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(OneLine(std::io::stderr))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter(directives.as_deref(), default));
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

/// A writer of whole events whose line breaks, but the last, are written as `\n` (and `\r` as `\r`):
/// one event is one line, whatever a field holds. The fmt layer writes each event whole, in one
/// `write_all` of a formatted buffer, so one call here is one event.
#[derive(Clone, Copy)]
pub struct OneLine<M>(pub M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for OneLine<M> {
    type Writer = OneLine<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        OneLine(self.0.make_writer())
    }
}

impl<W: std::io::Write> std::io::Write for OneLine<W> {
    fn write(&mut self, event: &[u8]) -> std::io::Result<usize> {
        let (body, end) = match event.strip_suffix(b"\n") {
            Some(body) => (body, &b"\n"[..]),
            None => (event, &b""[..]),
        };
        if !body.iter().any(|b| matches!(b, b'\n' | b'\r')) {
            self.0.write_all(event)?;
            return Ok(event.len());
        }
        let mut line = Vec::with_capacity(event.len() + 16);
        for &byte in body {
            match byte {
                b'\n' => line.extend_from_slice(b"\\n"),
                b'\r' => line.extend_from_slice(b"\\r"),
                _ => line.push(byte),
            }
        }
        line.extend_from_slice(end);
        self.0.write_all(&line)?;
        Ok(event.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata_allowed(target: &'static str, level: Level) -> bool {
        struct Callsite;
        impl tracing::callsite::Callsite for Callsite {
            fn set_interest(&self, _: tracing::subscriber::Interest) {}
            fn metadata(&self) -> &Metadata<'_> {
                // Never called: the filter is asked about metadata, not about its callsite.
                panic!("the callsite's metadata is not needed")
            }
        }
        static CALLSITE: Callsite = Callsite;
        let metadata = Metadata::new(
            "event",
            target,
            level,
            None,
            None,
            None,
            tracing::field::FieldSet::new(&[], tracing::callsite::Identifier(&CALLSITE)),
            tracing::metadata::Kind::EVENT,
        );
        allowed(&metadata)
    }

    fn most_verbose(directives: Option<&str>, default: &str) -> Option<LevelFilter> {
        Filter::<tracing_subscriber::Registry>::max_level_hint(&filter(directives, default))
    }

    #[test]
    fn the_filter_states_the_directives_most_verbose_level() {
        // What `log::max_level` is set to: above it, a library's `log::trace!` costs one comparison.
        assert_eq!(most_verbose(None, "off"), Some(LevelFilter::OFF));
        assert_eq!(most_verbose(None, DEFAULT), Some(LevelFilter::INFO));
        assert_eq!(
            most_verbose(Some("warn,voicehost=debug"), "off"),
            Some(LevelFilter::DEBUG)
        );
        assert_eq!(most_verbose(Some("trace"), "off"), Some(LevelFilter::TRACE));
        // Span and field directives count too: what they may enable is never hidden.
        assert_eq!(
            most_verbose(Some("warn,[call]=debug"), "off"),
            Some(LevelFilter::DEBUG)
        );
        assert_eq!(
            most_verbose(Some("voicehost[call{id=1}]=debug"), "off"),
            Some(LevelFilter::TRACE)
        );
    }

    #[test]
    fn the_libraries_that_see_secrets_are_held_at_info() {
        assert!(!metadata_allowed(
            "tungstenite::handshake::client",
            Level::TRACE
        ));
        assert!(!metadata_allowed("tungstenite", Level::DEBUG));
        assert!(!metadata_allowed("rustls::client", Level::TRACE));
        assert!(metadata_allowed("tungstenite::protocol", Level::INFO));
        assert!(metadata_allowed("tungstenite", Level::WARN));
        // Only whole path segments: another crate whose name starts the same is not held.
        assert!(metadata_allowed("hyperion", Level::TRACE));
        assert!(metadata_allowed("voicehost::agent", Level::TRACE));
    }

    #[test]
    fn what_a_guests_requests_make_wasi_http_log_is_held_at_error() {
        assert!(!metadata_allowed(
            "wasmtime_wasi_http::p2::error",
            Level::WARN
        ));
        assert!(!metadata_allowed("wasmtime_wasi_http", Level::INFO));
        assert!(metadata_allowed("wasmtime_wasi_http::ctx", Level::ERROR));
        assert!(metadata_allowed("wasmtime_wasi", Level::WARN));
    }

    /// A log kept in memory.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_guests_text_with_line_breaks_stays_on_its_events_line() {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer({
                let captured = captured.clone();
                OneLine(move || captured.clone())
            })
            .with_ansi(false)
            .finish();
        let forged = "oops\n2026-12-03T00:00:00Z  INFO voicehost: tenant acme deleted\r";
        tracing::subscriber::with_default(subscriber, || {
            // A field named `message` is written as it is, without the quoting other fields get.
            tracing::warn!(session = "vs_1", message = forged, "the handler failed");
            tracing::warn!(session = "vs_1", error = forged, "the handler failed");
            tracing::warn!("{forged}");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(text.lines().all(|line| line.contains("WARN")), "{text}");
        assert!(text.contains("oops\\n2026"), "{text}");
    }
}
