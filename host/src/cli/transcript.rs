//! `voicehost call`'s transcript: one line per thing that happens on the call, on stdout. The host's own
//! log reaches it through [`init`]: the agent's log lines (at `info` and above) and the host's warnings
//! (a trap, a failed handler, the failure policy) become lines of the transcript; the rest of the host's
//! log goes to stderr, only when `RUST_LOG` asks for it.

use crate::logging::{self, OneLine};
use std::fmt::Debug;
use std::io::Write as _;
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::{Level, Metadata, Subscriber};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer;

/// One line of the transcript. A reader that stopped reading (`| head`) ends nothing.
pub fn say(line: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// A guest's (or a file's) text on one line: its line breaks written as `\n`, and every other control
/// character (a terminal's escape sequences, bidirectional overrides) as its code, so that it can neither
/// forge a line nor rewrite the terminal.
pub fn one_line(text: &str) -> String {
    let mut line = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => line.push_str("\\n"),
            '\r' => line.push_str("\\r"),
            '\t' => line.push_str("\\t"),
            c if c.is_control()
                || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') =>
            {
                line.extend(c.escape_unicode());
            }
            c => line.push(c),
        }
    }
    line
}

/// Installs the log of `voicehost call`: the transcript's part of it on stdout, `RUST_LOG`'s on stderr.
pub fn init() {
    let host_log = std::env::var("RUST_LOG").ok().map(|directives| {
        tracing_subscriber::fmt::layer()
            .with_writer(OneLine(std::io::stderr))
            .with_ansi(false)
            .with_filter(logging::filter(Some(&directives), "off"))
    });
    let transcript =
        Transcript.with_filter(filter_fn(shown).with_max_level_hint(LevelFilter::INFO));
    let _ = tracing_subscriber::registry()
        .with(transcript)
        .with(host_log)
        .try_init();
}

/// The host's events that belong in the transcript: the guest's log lines, and the host's warnings.
fn shown(metadata: &Metadata<'_>) -> bool {
    let level = *metadata.level();
    metadata.target().starts_with("voicehost")
        && level <= Level::INFO
        && (level <= Level::WARN || metadata.fields().field("guest").is_some())
}

struct Transcript;

impl<S: Subscriber> Layer<S> for Transcript {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let level = *event.metadata().level();
        let line = match fields.guest {
            Some(text) if text.is_empty() => format!("log: (an empty line, at {level})"),
            Some(text) if level == Level::INFO => format!("log: {}", one_line(&text)),
            Some(text) => format!(
                "log[{}]: {}",
                level.as_str().to_lowercase(),
                one_line(&text)
            ),
            None if fields.rest.is_empty() => format!("host: {}", one_line(&fields.message)),
            None => format!(
                "host: {} ({})",
                one_line(&fields.message),
                one_line(&fields.rest.join(", "))
            ),
        };
        say(&line);
    }
}

/// An event's fields: its message, the guest's text, and the rest as `name=value` (the session aside:
/// the transcript is one call's).
#[derive(Default)]
struct Fields {
    message: String,
    guest: Option<String>,
    rest: Vec<String>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_string(),
            "guest" => self.guest = Some(value.to_string()),
            "session" => {}
            name => self.rest.push(format!("{name}={value}")),
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "guest" => self.guest = Some(format!("{value:?}")),
            "session" => {}
            name => self.rest.push(format!("{name}={value:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_escapes_line_breaks_and_terminal_controls() {
        assert_eq!(one_line("a\nb\r"), "a\\nb\\r");
        assert_eq!(one_line("\u{1b}[2J"), "\\u{1b}[2J");
        assert_eq!(one_line("é ok"), "é ok");
    }
}
