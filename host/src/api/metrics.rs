//! `/metrics`: every served agent's counters in the OpenMetrics text format, labelled by tenant and agent,
//! encoded by `prometheus-client` from the agents' [`Stats`] at each scrape. Only counts and ids: never a
//! key, a token, a caller's number or what was said.

use crate::sandbox::{TrapKind, HANDLERS};
use crate::stats::{Counter, Stats};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;

/// The media type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the whole host counts, beside each agent's [`Stats`].
pub struct HostCounts<'a> {
    /// Components this process compiled.
    pub compilations: &'a Counter,
    /// Components this process loaded from the compiled cache.
    pub cache_loads: &'a Counter,
    /// Connections the admin listener closed at once: it was full, or their client had too many open.
    pub admin_refused: &'a Counter,
    /// In a cluster: whether the shared registry can be reached, and how many other hosts' changes to
    /// it this host has taken.
    pub cluster: Option<(bool, &'a Counter)>,
}

/// A series of each agent: its name (a counter's without `_total`, which the encoder adds), its help, how to
/// read it.
type AgentSeries = (&'static str, &'static str, Read);

/// How a series is read from an agent's [`Stats`].
#[derive(Clone, Copy)]
enum Read {
    /// A counter the agent keeps, encoded as it is.
    Counter(fn(&Stats) -> &Counter),
    /// A value read at the scrape, encoded as a gauge.
    Gauge(fn(&Stats) -> i64),
}

use Read::{Counter as C, Gauge as G};

const SERIES: [AgentSeries; 24] = [
    (
        "sessions_started",
        "Calls Sent started with the agent.",
        C(|s| &s.sessions_started),
    ),
    (
        "sessions_ended",
        "Calls that ended with session.end.",
        C(|s| &s.sessions_ended),
    ),
    (
        "sessions_lost",
        "Calls lost: no resume was possible.",
        C(|s| &s.sessions_lost),
    ),
    (
        "sessions_refused",
        "Calls over a session cap, given the failure policy at once.",
        C(|s| &s.sessions_refused),
    ),
    (
        "sessions_host_full",
        "Calls that found no pool slot their tenant may take (the rest reserved or in use), given the failure policy at once.",
        C(|s| &s.sessions_host_full),
    ),
    (
        "restarts",
        "Fresh instances after a trap.",
        C(|s| &s.restarts),
    ),
    (
        "deprecated_world_calls",
        "Calls served by a component built against a deprecated world (voicehost:agent@0.1.0): rebuild it against 0.3.0.",
        C(|s| &s.deprecated_world_calls),
    ),
    (
        "handler_errors",
        "Handlers that returned an error.",
        C(|s| &s.handler_errors),
    ),
    (
        "failure_policies",
        "Failure policies applied (repeated traps, over a cap, no instance, or behind Sent).",
        C(|s| &s.policies_applied),
    ),
    (
        "calls_handed_over",
        "Calls handed over to another host of the cluster while this one left (a rolling restart).",
        C(|s| &s.calls_handed_over),
    ),
    (
        "calls_taken_over",
        "Calls another host of the cluster handed over, taken here (or taken back after no peer took them).",
        C(|s| &s.calls_taken_over),
    ),
    (
        "frames_in",
        "Counted text frames read from Sent for the agent's calls.",
        C(|s| &s.frames_in),
    ),
    (
        "frames_out",
        "Text frames sessions sent to Sent.",
        C(|s| &s.frames_out),
    ),
    ("audio_in", "Audio messages from Sent.", C(|s| &s.audio_in)),
    (
        "audio_out",
        "Audio messages sent to Sent.",
        C(|s| &s.audio_out),
    ),
    (
        "audio_dropped",
        "Caller audio dropped: the agent was behind, or the call ended with audio queued.",
        C(|s| &s.audio_dropped),
    ),
    (
        "audio_out_dropped",
        "The agent's audio dropped: over its backlog, after the end, or while moving.",
        C(|s| &s.audio_out_dropped),
    ),
    (
        "frames_invalid",
        "Messages from Sent dropped as invalid, or ignored as repeated.",
        C(|s| &s.frames_invalid),
    ),
    (
        "frames_dropped",
        "Frames from Sent a guest could not keep up with (its call got the failure policy).",
        C(|s| &s.frames_dropped),
    ),
    (
        "resumes",
        "Sessions resumed on another connection.",
        C(|s| &s.resumes),
    ),
    (
        "guest_log_dropped",
        "Guest log lines over the rate limit, dropped.",
        C(|s| &s.log_dropped),
    ),
    (
        "connections_opened",
        "Connections to Sent opened.",
        C(|s| &s.connections_opened),
    ),
    (
        "sessions_live",
        "Calls being served now.",
        G(|s| s.live_count() as i64),
    ),
    (
        "connections_open",
        "Connections to Sent open now.",
        G(|s| s.connections_open.get().max(0)),
    ),
];

/// The text of `/metrics` for these agents: (tenant, agent, stats); with the whole host's counts for the
/// operator, without them for a tenant's own view (`/v1/metrics`).
pub fn render(agents: &[(String, String, Arc<Stats>)], host: Option<HostCounts<'_>>) -> String {
    let mut registry = Registry::with_prefix("voicehost");
    registry.register_collector(Box::new(Agents(agents.to_vec())));
    if let Some(host) = host {
        registry.register_collector(Box::new(Host {
            agents_served: agents.len() as u64,
            compilations: host.compilations.clone(),
            cache_loads: host.cache_loads.clone(),
            admin_refused: host.admin_refused.clone(),
            cluster: host
                .cluster
                .map(|(reachable, changes)| (reachable, changes.clone())),
        }));
    }
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// Each agent's series, read at the scrape.
#[derive(Debug)]
struct Agents(Vec<(String, String, Arc<Stats>)>);

impl Collector for Agents {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        for (name, help, read) in SERIES {
            let metric_type = match read {
                Read::Counter(_) => MetricType::Counter,
                Read::Gauge(_) => MetricType::Gauge,
            };
            let mut family = encoder.encode_descriptor(name, help, None, metric_type)?;
            for (tenant, agent, stats) in &self.0 {
                let labels = [("tenant", tenant.as_str()), ("agent", agent.as_str())];
                let sample = family.encode_family(&labels)?;
                match read {
                    Read::Counter(counter) => counter(stats).encode(sample)?,
                    Read::Gauge(value) => ConstGauge::new(value(stats)).encode(sample)?,
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "traps",
            "Traps contained, by kind.",
            None,
            MetricType::Counter,
        )?;
        for (tenant, agent, stats) in &self.0 {
            for kind in TrapKind::ALL {
                let labels = [
                    ("tenant", tenant.as_str()),
                    ("agent", agent.as_str()),
                    ("kind", kind.as_str()),
                ];
                stats
                    .trap_counter(kind)
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "handler_duration",
            "Handler calls into the agent, by handler.",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        for (tenant, agent, stats) in &self.0 {
            for (handler, histogram) in HANDLERS.iter().zip(&stats.handlers.0) {
                let labels = [
                    ("tenant", tenant.as_str()),
                    ("agent", agent.as_str()),
                    ("handler", handler),
                ];
                // The encoder writes the `le` label before the family's, and the last bucket as `+Inf`.
                histogram.encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The whole host's series, for the operator's view only.
#[derive(Debug)]
struct Host {
    agents_served: u64,
    compilations: Counter,
    cache_loads: Counter,
    admin_refused: Counter,
    cluster: Option<(bool, Counter)>,
}

impl Collector for Host {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let gauge = ConstGauge::new(self.agents_served as i64);
        gauge.encode(encoder.encode_descriptor(
            "agents_served",
            "Agents with an active version being served.",
            None,
            gauge.metric_type(),
        )?)?;
        for (name, help, counter) in [
            (
                "compilations",
                "Components compiled by this process.",
                &self.compilations,
            ),
            (
                "compiled_cache_loads",
                "Components loaded from the compiled cache instead.",
                &self.cache_loads,
            ),
            (
                "admin_connections_refused",
                "Admin connections closed at once: the listener was full, or the client had too many open.",
                &self.admin_refused,
            ),
        ] {
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        if let Some((reachable, changes)) = &self.cluster {
            let gauge = ConstGauge::new(i64::from(*reachable));
            gauge.encode(encoder.encode_descriptor(
                "cluster_registry_reachable",
                "1 while the cluster's shared registry (NATS) can be reached, 0 while it cannot.",
                None,
                gauge.metric_type(),
            )?)?;
            changes.encode(encoder.encode_descriptor(
                "cluster_registry_changes",
                "Other hosts' changes to the shared registry this host has taken.",
                None,
                changes.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_sample_line_parses_as_name_labels_value() {
        let stats = Arc::new(Stats::default());
        stats.sessions_started.inc();
        stats.trap(TrapKind::CpuDeadline);
        stats.handlers.0[1].observe(Duration::from_micros(700).as_secs_f64());
        stats.handlers.0[1].observe(Duration::from_secs(9).as_secs_f64());
        let counts = (Counter::default(), Counter::default(), Counter::default());
        counts.0.inc();
        let text = render(
            &[("acme".into(), "agent_a".into(), stats)],
            Some(HostCounts {
                compilations: &counts.0,
                cache_loads: &counts.1,
                admin_refused: &counts.2,
                cluster: Some((true, &counts.1)),
            }),
        );
        for line in [
            "voicehost_sessions_started_total{tenant=\"acme\",agent=\"agent_a\"} 1",
            "voicehost_sessions_live{tenant=\"acme\",agent=\"agent_a\"} 0",
            "voicehost_traps_total{tenant=\"acme\",agent=\"agent_a\",kind=\"cpu_deadline\"} 1",
            "voicehost_handler_duration_seconds_bucket{le=\"0.001\",tenant=\"acme\",agent=\"agent_a\",handler=\"on-user-said\"} 1",
            // 9 s is above every bound: in +Inf only, not in the 5 s bucket.
            "voicehost_handler_duration_seconds_bucket{le=\"5.0\",tenant=\"acme\",agent=\"agent_a\",handler=\"on-user-said\"} 1",
            "voicehost_handler_duration_seconds_bucket{le=\"+Inf\",tenant=\"acme\",agent=\"agent_a\",handler=\"on-user-said\"} 2",
            "voicehost_handler_duration_seconds_count{tenant=\"acme\",agent=\"agent_a\",handler=\"on-user-said\"} 2",
            "voicehost_compilations_total 1",
            "voicehost_agents_served 1",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\nnot in\n{text}");
        }
        let sum = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("voicehost_handler_duration_seconds_sum{tenant=\"acme\",agent=\"agent_a\",handler=\"on-user-said\"} ")
            })
            .expect(&text);
        assert!((sum.parse::<f64>().unwrap() - 9.0007).abs() < 1e-9, "{sum}");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = line.rsplit_once(' ').expect(line);
            assert!(value.parse::<f64>().is_ok(), "{line}");
            assert!(name.starts_with("voicehost_"), "{line}");
        }
    }

    #[test]
    fn a_tenants_view_has_no_host_series() {
        let text = render(&[("acme".into(), "agent_a".into(), Arc::default())], None);
        assert!(!text.contains("compilations"), "{text}");
        assert!(text.contains("voicehost_sessions_started_total{tenant=\"acme\""));
    }
}
