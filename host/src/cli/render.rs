//! What the commands print: tables and views of the API's answers, safe on a terminal.

use super::*;

pub(super) fn pretty(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    text.push('\n');
    text
}

/// Columns padded to their widest cell, two spaces apart, no trailing spaces.
pub(super) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|title| title.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|title| title.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            line.push_str(&format!("{cell:<width$}  "));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// What the server or Sent sent, safe to print on a terminal (no escape sequences).
pub(super) fn clean(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

/// A number, or `-` for none.
pub(super) fn number_text(number: Option<u32>) -> String {
    number.map_or_else(|| "-".into(), |number| number.to_string())
}

pub(super) fn policy_text(policy: &FailurePolicy) -> String {
    clean(&policy.to_string())
}

pub(super) fn party_text(party: &PartyView) -> String {
    match &party.value {
        Some(value) => clean(&format!("{}:{value}", party.kind)),
        // An anonymous caller has no value.
        None => clean(&party.kind),
    }
}

pub(super) fn size_text(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} B"),
        1024..0x10_0000 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        _ => format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0)),
    }
}

/// `sha256:` and the first 12 hex digits.
pub(super) fn short_digest(digest: &str) -> String {
    let digest = clean(digest);
    match digest.strip_prefix("sha256:") {
        Some(hex) if hex.len() > 12 => format!("sha256:{}", &hex[..12]),
        _ => digest,
    }
}

/// Unix seconds as `YYYY-MM-DD HH:MM:SS` in UTC.
pub(super) fn time_text(seconds: u64) -> String {
    // Past i64 is past any date worth printing; held there, the arithmetic below cannot overflow.
    let seconds = i64::try_from(seconds).unwrap_or(i64::MAX);
    let (days, second_of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60
    )
}

/// The agent's status, with Sent's reason when it refused the agent.
pub(super) fn status_text(agent: &AgentView) -> String {
    let status = agent.status.as_str();
    match &agent.status_detail {
        Some(detail) => format!("{status} ({})", clean(detail)),
        None => status.into(),
    }
}

/// `voicehost agents list`: one line per agent.
pub fn agents_table(list: &AgentList) -> String {
    if list.agents.is_empty() {
        return "no agents yet (voicehost agents upload AGENT FILE --activate)\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .agents
        .iter()
        .map(|agent| {
            vec![
                clean(&agent.agent_id),
                agent.status.as_str().into(),
                number_text(agent.active_version),
                agent.versions.len().to_string(),
                agent.live_sessions.to_string(),
                policy_text(&agent.failure_policy),
            ]
        })
        .collect();
    table(
        &[
            "AGENT",
            "STATUS",
            "ACTIVE",
            "VERSIONS",
            "LIVE CALLS",
            "ON FAILURE",
        ],
        &rows,
    )
}

/// `voicehost agents show`: the agent, then its versions.
pub(super) fn agent_text(agent: &AgentView) -> String {
    let active = match agent.active_version {
        None => "none (the agent serves no calls)".to_string(),
        Some(version) => format!("version {version}"),
    };
    let mut out = table(
        &["agent", &clean(&agent.agent_id)],
        &[
            vec!["status".into(), status_text(agent)],
            vec!["active".into(), active],
            vec!["on failure".into(), policy_text(&agent.failure_policy)],
            vec!["live calls".into(), agent.live_sessions.to_string()],
        ],
    );
    out.push('\n');
    if agent.versions.is_empty() {
        out.push_str("no versions\n");
        return out;
    }
    let rows: Vec<Vec<String>> = agent
        .versions
        .iter()
        .map(|version| {
            vec![
                version.version.to_string(),
                short_digest(&version.digest),
                size_text(version.size_bytes),
                time_text(version.uploaded_at),
                world_text(version),
                if version.active {
                    "*".into()
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "VERSION",
            "DIGEST",
            "SIZE",
            "UPLOADED (UTC)",
            "WORLD",
            "ACTIVE",
        ],
        &rows,
    ));
    out
}

/// The world a version speaks, by its version, and whether it is deprecated.
fn world_text(version: &VersionView) -> String {
    let name = version.world.name();
    let number = name.rsplit('@').next().unwrap_or(name);
    if version.deprecated {
        format!("{number} (deprecated)")
    } else {
        number.to_string()
    }
}

/// `voicehost agents sessions`: one line per live call.
pub(super) fn usage_table(view: &UsageView) -> String {
    let (usage, quota) = (&view.usage, &view.quota);
    table(
        &["", "USED", "QUOTA"],
        &[
            vec![
                "versions".into(),
                usage.versions.to_string(),
                quota.versions.to_string(),
            ],
            vec![
                "components".into(),
                size_text(usage.stored_bytes),
                size_text(quota.stored_bytes),
            ],
            vec![
                "compiled".into(),
                size_text(usage.compiled_bytes),
                size_text(quota.compiled_bytes),
            ],
        ],
    )
}

pub(super) fn sessions_table(list: &SessionList) -> String {
    if list.sessions.is_empty() {
        return "no live calls\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .sessions
        .iter()
        .map(|session| {
            let media = match session.sample_rate {
                Some(rate) => format!("{} {rate} Hz", session.media.as_str()),
                None => session.media.as_str().into(),
            };
            vec![
                clean(&session.session_id),
                clean(&session.call_id),
                clean(&session.agent_id),
                session.version.to_string(),
                session.direction.as_str().into(),
                media,
                party_text(&session.from),
                party_text(&session.to),
                clean(&session.started_at),
            ]
        })
        .collect();
    table(
        &[
            "SESSION",
            "CALL",
            "AGENT",
            "VERSION",
            "DIRECTION",
            "MEDIA",
            "FROM",
            "TO",
            "STARTED",
        ],
        &rows,
    )
}

pub(super) fn uploaded(agent: &str, version: &VersionView) -> String {
    let number = version.version;
    let then = if version.active {
        "it is active: new calls get it".to_string()
    } else {
        format!("activate it with `voicehost agents activate {agent} {number}`")
    };
    format!(
        "{agent}: uploaded version {number} ({}, {}); {then}\n",
        clean(&version.digest),
        size_text(version.size_bytes)
    )
}

pub(super) fn activated(agent: &AgentView) -> String {
    format!(
        "{}: version {} is active: new calls get it, live calls finish on theirs\n",
        clean(&agent.agent_id),
        number_text(agent.active_version)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::World;
    use serde_json::{json, Value};

    /// `answer` read as the view the CLI expects: the rendering tests feed the API's JSON as written.
    fn parsed<T: DeserializeOwned>(answer: Value) -> T {
        serde_json::from_value(answer).unwrap()
    }

    fn agent_json() -> Value {
        json!({
            "agent_id": "agent_abc123",
            "status": "refused",
            "status_detail": "Sent refused the connection (401): the API key is not valid",
            "active_version": 2,
            "failure_policy": {"action": "transfer", "to": {"kind": "number", "value": "+14155550100"}},
            "live_sessions": 3,
            "versions": [
                {"version": 1, "digest": format!("sha256:{}", "9f86d081884c".repeat(5) + "7d65"),
                 "size_bytes": 1843201, "uploaded_at": 1767225600, "world": "voicehost:agent@0.1.0",
                 "deprecated": true, "active": false},
                {"version": 2, "digest": format!("sha256:{}", "60303ae22b99".repeat(5) + "8861"),
                 "size_bytes": 900, "uploaded_at": 1767312001, "world": "voicehost:agent@0.3.0",
                 "deprecated": false, "active": true}
            ]
        })
    }

    #[test]
    fn the_agents_table() {
        let idle = json!({"agent_id": "agent_new", "status": "inactive", "active_version": null,
                          "failure_policy": {"action": "hangup"}, "live_sessions": 0, "versions": []});
        let answer = json!({"agents": [agent_json(), idle]});
        assert_eq!(
            agents_table(&parsed(answer)),
            "AGENT         STATUS    ACTIVE  VERSIONS  LIVE CALLS  ON FAILURE\n\
             agent_abc123  refused   2       2         3           transfer:number:+14155550100\n\
             agent_new     inactive  -       0         0           hangup\n"
        );
        assert!(agents_table(&AgentList { agents: vec![] }).starts_with("no agents yet"));
    }

    #[test]
    fn the_agent_view() {
        assert_eq!(
            agent_text(&parsed(agent_json())),
            "agent       agent_abc123\n\
             status      refused (Sent refused the connection (401): the API key is not valid)\n\
             active      version 2\n\
             on failure  transfer:number:+14155550100\n\
             live calls  3\n\
             \n\
             VERSION  DIGEST               SIZE     UPLOADED (UTC)       WORLD               ACTIVE\n\
             1        sha256:9f86d081884c  1.8 MiB  2026-01-01 00:00:00  0.1.0 (deprecated)\n\
             2        sha256:60303ae22b99  900 B    2026-01-02 00:00:01  0.3.0               *\n"
        );
    }

    #[test]
    fn the_sessions_table() {
        let answer = json!({"sessions": [
            {"session_id": "vs_1", "call_id": "call_1", "agent_id": "agent_abc123", "version": 2,
             "direction": "inbound", "media": "audio", "sample_rate": 16000,
             "started_at": "2026-01-02T15:04:05Z",
             "from": {"kind": "number", "value": "+14155550100"},
             "to": {"kind": "agent", "value": "agent_abc123"}},
            {"session_id": "vs_2", "call_id": "call_2", "agent_id": "agent_abc123", "version": 1,
             "direction": "outbound", "media": "text", "sample_rate": null,
             "started_at": "2026-01-02T15:00:00Z",
             "from": {"kind": "agent", "value": "agent_abc123"},
             "to": {"kind": "number", "value": "+1415\u{1b}[2J"}}
        ]});
        assert_eq!(
            sessions_table(&parsed(answer)),
            "SESSION  CALL    AGENT         VERSION  DIRECTION  MEDIA           FROM                 \
             TO                  STARTED\n\
             vs_1     call_1  agent_abc123  2        inbound    audio 16000 Hz  number:+14155550100  \
             agent:agent_abc123  2026-01-02T15:04:05Z\n\
             vs_2     call_2  agent_abc123  1        outbound   text            agent:agent_abc123   \
             number:+1415\u{fffd}[2J    2026-01-02T15:00:00Z\n"
        );
        assert_eq!(
            sessions_table(&SessionList { sessions: vec![] }),
            "no live calls\n"
        );
    }

    #[test]
    fn sizes_times_and_upload_lines() {
        assert_eq!(size_text(1023), "1023 B");
        assert_eq!(size_text(1536), "1.5 KiB");
        assert_eq!(size_text(18 << 20), "18.0 MiB");
        assert_eq!(time_text(0), "1970-01-01 00:00:00");
        assert_eq!(time_text(951_825_599), "2000-02-29 11:59:59");
        assert!(time_text(u64::MAX).ends_with(" 15:30:07"));
        assert_eq!(
            party_text(&parsed(json!({"kind": "anonymous", "value": null}))),
            "anonymous"
        );
        assert_eq!(
            party_text(&PartyView {
                kind: "number".into(),
                value: Some("+14155550100".into())
            }),
            "number:+14155550100"
        );
        let version = VersionView {
            version: 4,
            digest: "sha256:ab".into(),
            size_bytes: 2048,
            uploaded_at: 0,
            world: World::V0_3,
            deprecated: false,
            active: false,
        };
        assert_eq!(
            uploaded("agent_1", &version),
            "agent_1: uploaded version 4 (sha256:ab, 2.0 KiB); activate it with \
             `voicehost agents activate agent_1 4`\n"
        );
    }
}
