//! The host's log: `RUST_LOG` directives, except that the libraries that see secrets on the wire are held
//! at `info` whatever they say (scenario `secrets_never_logged_at_trace`): tungstenite logs the upgrade
//! request (with the API key) and every frame (with resume tokens) at `trace`; rustls, hyper and h2 see
//! headers. What the host logs itself never carries a key or a token (see [`voicehost_proto::wire::loggable`]).

use tracing::level_filters::LevelFilter;
use tracing::{Level, Metadata};
use tracing_subscriber::filter::{filter_fn, EnvFilter, FilterExt};
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

/// What `voicehost` logs without `RUST_LOG`: its own events from `info`, the engine's warnings.
pub const DEFAULT: &str = "info,wasmtime=warn,cranelift=warn";

/// Whether an event or span of `metadata` may be logged at all, whatever the directives say.
pub fn allowed(metadata: &Metadata<'_>) -> bool {
    let target = metadata.target();
    let held = HELD_AT_INFO.iter().any(|held| {
        target
            .strip_prefix(held)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    });
    !held || *metadata.level() <= Level::INFO
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
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter(directives.as_deref(), default));
    let _ = tracing_subscriber::registry().with(layer).try_init();
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
}
