//! `/metrics`: every served agent's counters in the Prometheus text format (0.0.4), labelled by tenant and
//! agent. Only counts and ids: never a key, a token, a caller's number or what was said.

use crate::sandbox::{TrapKind, HANDLERS};
use crate::stats::{Counter, Stats, LATENCY_BUCKETS};
use std::fmt::Write as _;

/// What the whole host counts, beside each agent's [`Stats`].
pub struct HostCounts<'a> {
    pub compilations: &'a Counter,
    pub cache_loads: &'a Counter,
}

/// A series of each agent: its name, its help, its type (counter or gauge), how to read it.
type AgentSeries = (&'static str, &'static str, &'static str, fn(&Stats) -> u64);

/// The text of `/metrics` for these agents: (tenant, agent, stats); with the whole host's counts for the
/// operator, without them for a tenant's own view (`/v1/metrics`).
pub fn render(
    agents: &[(String, String, std::sync::Arc<Stats>)],
    host: Option<HostCounts<'_>>,
) -> String {
    let mut out = String::new();
    const C: &str = "counter";
    let series: [AgentSeries; 20] = [
        (
            "sessions_started_total",
            "Calls Sent started with the agent.",
            C,
            |s| s.sessions_started.get(),
        ),
        (
            "sessions_ended_total",
            "Calls that ended with session.end.",
            C,
            |s| s.sessions_ended.get(),
        ),
        (
            "sessions_lost_total",
            "Calls lost: no resume was possible.",
            C,
            |s| s.sessions_lost.get(),
        ),
        (
            "sessions_refused_total",
            "Calls over a session cap, given the failure policy at once.",
            C,
            |s| s.sessions_refused.get(),
        ),
        ("restarts_total", "Fresh instances after a trap.", C, |s| {
            s.restarts.get()
        }),
        (
            "handler_errors_total",
            "Handlers that returned an error.",
            C,
            |s| s.handler_errors.get(),
        ),
        (
            "failure_policies_total",
            "Failure policies applied (repeated traps or over a cap).",
            C,
            |s| s.policies_applied.get(),
        ),
        (
            "frames_in_total",
            "Text frames from Sent delivered to sessions.",
            C,
            |s| s.frames_in.get(),
        ),
        (
            "frames_out_total",
            "Text frames sessions sent to Sent.",
            C,
            |s| s.frames_out.get(),
        ),
        ("audio_in_total", "Audio messages from Sent.", C, |s| {
            s.audio_in.get()
        }),
        ("audio_out_total", "Audio messages sent to Sent.", C, |s| {
            s.audio_out.get()
        }),
        (
            "audio_dropped_total",
            "Caller audio dropped because the agent was behind.",
            C,
            |s| s.audio_dropped.get(),
        ),
        (
            "audio_out_dropped_total",
            "The agent's audio dropped: over its backlog, after the end, or while moving.",
            C,
            |s| s.audio_out_dropped.get(),
        ),
        (
            "frames_invalid_total",
            "Messages from Sent dropped as invalid, or ignored as repeated.",
            C,
            |s| s.frames_invalid.get(),
        ),
        (
            "frames_dropped_total",
            "Frames from Sent a guest could not keep up with (its call got the failure policy).",
            C,
            |s| s.frames_dropped.get(),
        ),
        (
            "resumes_total",
            "Sessions resumed on another connection.",
            C,
            |s| s.resumes.get(),
        ),
        (
            "guest_log_dropped_total",
            "Guest log lines over the rate limit, dropped.",
            C,
            |s| s.log_dropped.get(),
        ),
        (
            "connections_opened_total",
            "Connections to Sent opened.",
            C,
            |s| s.connections_opened.get(),
        ),
        ("sessions_live", "Calls being served now.", "gauge", |s| {
            s.live_count() as u64
        }),
        (
            "connections_open",
            "Connections to Sent open now.",
            "gauge",
            |s| s.connections_open.get().max(0) as u64,
        ),
    ];
    for (name, help, kind, value) in series {
        header(&mut out, name, help, kind);
        for (tenant, agent, stats) in agents {
            let _ = writeln!(
                out,
                "voicehost_{name}{{{}}} {}",
                labels(tenant, agent),
                value(stats)
            );
        }
    }
    header(
        &mut out,
        "traps_total",
        "Traps contained, by kind.",
        "counter",
    );
    for (tenant, agent, stats) in agents {
        for kind in TrapKind::ALL {
            let _ = writeln!(
                out,
                "voicehost_traps_total{{{},kind=\"{}\"}} {}",
                labels(tenant, agent),
                kind.as_str(),
                stats.trapped(kind)
            );
        }
    }
    header(
        &mut out,
        "handler_duration_seconds",
        "Handler calls into the agent, by handler.",
        "histogram",
    );
    for (tenant, agent, stats) in agents {
        for (handler, histogram) in HANDLERS.iter().zip(&stats.handlers) {
            let labels = format!("{},handler=\"{handler}\"", labels(tenant, agent));
            let cumulative = histogram.cumulative();
            for (bound, count) in LATENCY_BUCKETS.iter().zip(&cumulative) {
                let _ = writeln!(
                    out,
                    "voicehost_handler_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {count}"
                );
            }
            let total = cumulative.last().copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "voicehost_handler_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {total}"
            );
            let _ = writeln!(
                out,
                "voicehost_handler_duration_seconds_sum{{{labels}}} {}",
                histogram.sum_seconds()
            );
            let _ = writeln!(
                out,
                "voicehost_handler_duration_seconds_count{{{labels}}} {total}"
            );
        }
    }
    let Some(host) = host else {
        return out;
    };
    header(
        &mut out,
        "agents_served",
        "Agents with an active version being served.",
        "gauge",
    );
    let _ = writeln!(out, "voicehost_agents_served {}", agents.len());
    header(
        &mut out,
        "compilations_total",
        "Components compiled by this process.",
        "counter",
    );
    let _ = writeln!(
        out,
        "voicehost_compilations_total {}",
        host.compilations.get()
    );
    header(
        &mut out,
        "compiled_cache_loads_total",
        "Components loaded from the compiled cache instead.",
        "counter",
    );
    let _ = writeln!(
        out,
        "voicehost_compiled_cache_loads_total {}",
        host.cache_loads.get()
    );
    out
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP voicehost_{name} {help}");
    let _ = writeln!(out, "# TYPE voicehost_{name} {kind}");
}

fn labels(tenant: &str, agent: &str) -> String {
    format!("tenant=\"{}\",agent=\"{}\"", escape(tenant), escape(agent))
}

/// A label value as Prometheus reads it (ids are plain already; this keeps it so whatever they hold).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn every_sample_line_parses_as_name_labels_value() {
        let stats = Arc::new(Stats::default());
        stats.sessions_started.inc();
        stats.handlers[1].observe(Duration::from_micros(700));
        let counts = (Counter::default(), Counter::default());
        let text = render(
            &[("acme".into(), "agent_a".into(), stats)],
            Some(HostCounts {
                compilations: &counts.0,
                cache_loads: &counts.1,
            }),
        );
        assert!(text
            .contains("voicehost_sessions_started_total{tenant=\"acme\",agent=\"agent_a\"} 1\n"));
        assert!(text.contains(
            "voicehost_handler_duration_seconds_bucket{tenant=\"acme\",agent=\"agent_a\",handler=\"on-user-said\",le=\"0.001\"} 1\n"
        ));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = line.rsplit_once(' ').expect(line);
            assert!(value.parse::<f64>().is_ok(), "{line}");
            assert!(name.starts_with("voicehost_"), "{line}");
        }
    }
}
