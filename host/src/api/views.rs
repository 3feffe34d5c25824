//! The admin API's JSON as types: what `voicehost serve` answers (`api/mod.rs` builds these) and what
//! `voicehost agents` reads (`cli/` parses answers into these), so the two cannot drift apart.
//! Plain data and nothing else: converting the server's records into views is the admin API's business,
//! rendering them as tables the CLI's. Their `ToSchema` derives make the OpenAPI document's schemas (see
//! `api/doc.rs`), so the document cannot drift from them either.
//!
//! Serialised, a view is the JSON on the wire field for field, in the order declared here. Reading is
//! lenient where a newer host may add to it (unknown fields are ignored), except for the request bodies
//! the host reads, which refuse what they do not know.

use crate::sandbox::World;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use voicehost_proto::call::FailurePolicy;

/// The agent's status is the tenancy's own type (one representation, serialised as it is).
pub use crate::tenancy::AgentStatus;

/// One of a tenant's agents (`GET /v1/agents/{agent_id}`, and the answer to activate, rollback and
/// failure-policy).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = Agent, example = json!({
    "agent_id": "agent_abc123", "status": "serving", "active_version": 2, "served_version": 2,
    "failure_policy": {"action": "transfer", "to": {"kind": "number", "value": "+14155550100"}},
    "live_sessions": 3,
    "versions": [
        {"version": 1, "digest": "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
         "size_bytes": 1843201, "uploaded_at": 1767225600,
         "world": "voicehost:agent@0.1.0", "deprecated": true, "active": false},
        {"version": 2, "digest": "sha256:60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752",
         "size_bytes": 1851904, "uploaded_at": 1767312000,
         "world": "voicehost:agent@0.3.0", "deprecated": false, "active": true}
    ]
}))]
pub struct AgentView {
    /// The agent's id, as Sent knows it (`agent_…`).
    #[schema(pattern = r"^agent_[A-Za-z0-9-]{1,58}$", example = "agent_abc123")]
    pub agent_id: String,
    /// Whether the agent's calls can reach it.
    pub status: AgentStatus,
    /// Why Sent refused the agent; only when the status is `refused`, and absent (not `null`) otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_detail: Option<String>,
    /// The version new calls get; `null` while no version is active (the agent serves no calls).
    #[schema(minimum = 1)]
    pub active_version: Option<u32>,
    /// The version this host gives new calls now: the active version once it is loaded here. In a
    /// cluster, right after another host made another version active, this host serves the one before
    /// until it has compiled the new one (a few seconds at most). `null` while this host does not serve the
    /// agent.
    #[schema(minimum = 1)]
    pub served_version: Option<u32>,
    /// What happens to a call the agent cannot serve.
    pub failure_policy: FailurePolicy,
    /// Calls in progress on this agent, whatever their version.
    pub live_sessions: u64,
    /// Every stored version, in version order.
    pub versions: Vec<VersionView>,
}

/// One uploaded component of an agent (in an agent's `versions`, and the 201 answer to an upload).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = Version, example = json!({
    "version": 3, "digest": "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae",
    "size_bytes": 1851904, "uploaded_at": 1767398400, "world": "voicehost:agent@0.3.0",
    "deprecated": false, "active": false
}))]
pub struct VersionView {
    /// From 1, one more for each upload; a number is never given again, even after its version is deleted.
    #[schema(minimum = 1)]
    pub version: u32,
    /// The SHA-256 of the component's bytes: `sha256:` and 64 lowercase hex digits (compare it with
    /// `sha256sum agent.wasm`).
    #[schema(pattern = "^sha256:[0-9a-f]{64}$")]
    pub digest: String,
    /// The component's size in bytes.
    pub size_bytes: u64,
    /// When it was uploaded, in Unix seconds (UTC).
    pub uploaded_at: u64,
    /// The version of the `voicehost:agent` world it was built against (0.1.0 from a host that did not
    /// say).
    #[serde(default = "World::recorded_before_0_2")]
    pub world: World,
    /// Whether that world is deprecated (0.1.0): it is served, but should be rebuilt against 0.3.0.
    #[serde(default)]
    pub deprecated: bool,
    /// Whether it is the agent's active version.
    pub active: bool,
}

/// A live call (in a `SessionList`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = Session, example = json!({
    "session_id": "vs_2b8f0c1d", "call_id": "call_7d1e44a0", "agent_id": "agent_abc123", "version": 2,
    "direction": "inbound", "media": "audio", "sample_rate": 16000, "started_at": "2026-01-02T15:04:05Z",
    "from": {"kind": "number", "value": "+14155550100"}, "to": {"kind": "agent", "value": "agent_abc123"}
}))]
pub struct SessionView {
    /// Sent's id of the session (`vs_…`).
    pub session_id: String,
    /// Sent's id of the call (`call_…`).
    pub call_id: String,
    /// The agent serving the call.
    #[schema(pattern = r"^agent_[A-Za-z0-9-]{1,58}$", example = "agent_abc123")]
    pub agent_id: String,
    /// The agent's version serving the call: the one active when the call started.
    #[schema(minimum = 1)]
    pub version: u32,
    /// Who placed the call.
    pub direction: Direction,
    /// What the call carries.
    pub media: Media,
    /// The audio sample rate in Hz for an audio call; `null` (present) for a text call.
    pub sample_rate: Option<u32>,
    /// When the call started, as Sent reported it (RFC 3339).
    pub started_at: String,
    /// The party the call is from.
    pub from: PartyView,
    /// The party the call is to.
    pub to: PartyView,
}

/// Who placed a call: `inbound` (someone called the agent) or `outbound` (the call was placed to someone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Someone called the agent.
    Inbound,
    /// The call was placed to someone (as the customer's backend asked Sent).
    Outbound,
}

impl Direction {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Inbound => "inbound",
            Direction::Outbound => "outbound",
        }
    }
}

/// What a call carries: `text` (Sent does speech recognition and synthesis) or `audio` (raw frames; the
/// rate is in the session's `sample_rate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Media {
    /// Text both ways: Sent turns speech into text and text into speech.
    Text,
    /// Raw audio both ways, at the session's `sample_rate`.
    Audio,
}

impl Media {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Media::Text => "text",
            Media::Audio => "audio",
        }
    }
}

/// A party of a call as Sent named it in the call's start. Unlike a transfer target (in a
/// `FailurePolicy`), its value may be missing: `null` for an anonymous caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = CallParty)]
pub struct PartyView {
    /// `user`, `number`, `conference`, `agent`, `anonymous`, or a kind Sent adds.
    pub kind: String,
    /// Who, for that kind; `null` (present) when Sent gave none.
    pub value: Option<String>,
}

/// The answer to `GET /v1/agents`: the tenant's agents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AgentList {
    /// The tenant's agents, in id order.
    pub agents: Vec<AgentView>,
}

/// The answer to `GET /v1/usage`: what the tenant keeps on the host, and its quota.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UsageView {
    /// What it keeps now.
    pub usage: crate::tenancy::Usage,
    /// What it may keep; an upload that would pass any part is `409 over_quota`.
    pub quota: crate::tenancy::Quota,
}

/// The answer to `GET /v1/sessions`: the tenant's live calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SessionList {
    /// The tenant's live calls, over all its agents.
    pub sessions: Vec<SessionView>,
}

/// The answer to `GET /healthz`: `{"status":"ok","agents":N,"loading":M}` (200) once the registry is read
/// and every active version the compiled cache holds is served, `{"status":"starting"}` (503) before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Health {
    /// The host has started (200): it serves every active version it could load from the compiled cache.
    Ok {
        /// Agents being served now, over all tenants (an active version that failed to load is not one).
        agents: u64,
        /// Active agents still waiting for their version to compile (after an upgrade emptied the
        /// compiled cache); each is served once compiled, and its tenant sees it as `loading`.
        loading: u64,
        /// In a cluster (`[cluster]`), whether the shared registry on NATS can be reached: when not, the
        /// host still serves its calls and the registry it last saw, and refuses admin changes (503)
        /// until NATS is back. Left out for a host with a registry of its own.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        registry_reachable: Option<bool>,
    },
    /// The host is still loading the active versions (503).
    Starting,
}

/// The body of every error answer: `{"error":{"code":…,"message":…}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    /// The error's code and message.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// What kind of error it is, e.g. `not_found` (one of `ErrorCode`). A string here, not the enum: a
    /// client must take a code it does not know from a newer host.
    #[schema(value_type = ErrorCode)]
    pub code: String,
    /// For people; it may change between releases: match on `code`.
    pub message: String,
}

impl ErrorBody {
    /// The body of an error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: code.as_str().to_string(),
                message: message.into(),
            },
        }
    }
}

/// What kind of error it is; each goes with one HTTP status, as listed here. A client matches on it, never
/// on the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 401: no `Authorization: Bearer` token, or not a token the host knows.
    Unauthorized,
    /// 404: no such agent or version for this tenant (another tenant's agent is not found too), or no
    /// such route.
    NotFound,
    /// 400: a body that is not the JSON expected, an upload for an agent id that is not Sent's or with a
    /// query other than `activate=true|false`, a version that is not a positive integer.
    BadRequest,
    /// 400: the uploaded body is not WebAssembly at all (or is empty).
    NotWasm,
    /// 400: the upload is a core WebAssembly module, not a component: build for `wasm32-wasip2`.
    CoreModule,
    /// 400: a component that does not validate or compile, e.g. a truncated file.
    InvalidComponent,
    /// 422: a valid component whose imports or exports do not fit the `voicehost:agent` world.
    WrongWorld,
    /// 413: the upload is over the tenant's component size cap.
    TooLarge,
    /// 422: a valid agent that could never start under the agent's limits: its initial memory is over
    /// `memory_mib` (at upload, or at activation after the limits were lowered).
    OverLimits,
    /// 409: the request clashes with the agent's state: deleting the active version, or a rollback with
    /// nothing to roll back to.
    Conflict,
    /// 409: the upload would take the tenant over its quota of versions, stored bytes or compiled bytes
    /// (`[quota]`); deleting versions makes room. `GET /v1/usage` says where it stands.
    OverQuota,
    /// 429: the tenant has as many uploads in progress as it may (`[admin] uploads_per_tenant`), asks
    /// faster than `requests_per_second`, or its client address failed to log in more than
    /// `failed_logins_per_minute`; the answer's `Retry-After` says when to try again.
    Busy,
    /// 408: the upload's body did not arrive within `[admin] upload_timeout_seconds`.
    Timeout,
    /// 500: the host failed; the operator's log says why.
    Internal,
    /// 503: in a cluster, the shared registry cannot be reached now (NATS down or cut off from this
    /// host): nothing was changed. The host keeps serving what it last saw; try again, or another host.
    Unavailable,
}

impl ErrorCode {
    /// Every code, in the order declared.
    pub const ALL: [ErrorCode; 15] = [
        ErrorCode::Unauthorized,
        ErrorCode::NotFound,
        ErrorCode::BadRequest,
        ErrorCode::NotWasm,
        ErrorCode::CoreModule,
        ErrorCode::InvalidComponent,
        ErrorCode::WrongWorld,
        ErrorCode::TooLarge,
        ErrorCode::OverLimits,
        ErrorCode::Conflict,
        ErrorCode::OverQuota,
        ErrorCode::Busy,
        ErrorCode::Timeout,
        ErrorCode::Internal,
        ErrorCode::Unavailable,
    ];

    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::NotFound => "not_found",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::NotWasm => "not_wasm",
            ErrorCode::CoreModule => "core_module",
            ErrorCode::InvalidComponent => "invalid_component",
            ErrorCode::WrongWorld => "wrong_world",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::OverLimits => "over_limits",
            ErrorCode::Conflict => "conflict",
            ErrorCode::OverQuota => "over_quota",
            ErrorCode::Busy => "busy",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Internal => "internal",
            ErrorCode::Unavailable => "unavailable",
        }
    }

    /// The HTTP status that goes with it.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::Unauthorized => 401,
            ErrorCode::NotFound => 404,
            ErrorCode::BadRequest
            | ErrorCode::NotWasm
            | ErrorCode::CoreModule
            | ErrorCode::InvalidComponent => 400,
            ErrorCode::WrongWorld | ErrorCode::OverLimits => 422,
            ErrorCode::TooLarge => 413,
            ErrorCode::Conflict | ErrorCode::OverQuota => 409,
            ErrorCode::Busy => 429,
            ErrorCode::Timeout => 408,
            ErrorCode::Internal => 500,
            ErrorCode::Unavailable => 503,
        }
    }
}

/// The body of `POST /v1/agents/{agent_id}/activate`. (The body of `PUT …/failure-policy` is a
/// `FailurePolicy` as it is.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActivateRequest {
    /// The version to make active: one of the agent's stored versions (else `404 not_found`).
    #[schema(minimum = 1)]
    pub version: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;

    /// `view` serialises to exactly `wire`, and `wire` reads back as `view`.
    fn exactly<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(
        view: &T,
        wire: &str,
    ) {
        assert_eq!(serde_json::to_string(view).unwrap(), wire);
        assert_eq!(&serde_json::from_str::<T>(wire).unwrap(), view);
    }

    fn version(version: u32, active: bool) -> VersionView {
        VersionView {
            version,
            digest: format!("sha256:{}", "ab".repeat(32)),
            size_bytes: 1843201,
            uploaded_at: 1767225600,
            world: World::V0_3,
            deprecated: false,
            active,
        }
    }

    #[test]
    fn agents_are_the_json_the_api_has_always_answered() {
        let serving = AgentView {
            agent_id: "agent_abc123".into(),
            status: AgentStatus::Serving,
            status_detail: None,
            active_version: Some(2),
            served_version: Some(2),
            failure_policy: "transfer:number:+14155550100".parse().unwrap(),
            live_sessions: 3,
            versions: vec![version(1, false), version(2, true)],
        };
        let digest = "ab".repeat(32);
        exactly(
            &serving,
            &format!(
                r#"{{"agent_id":"agent_abc123","status":"serving","active_version":2,"served_version":2,"failure_policy":{{"action":"transfer","to":{{"kind":"number","value":"+14155550100"}}}},"live_sessions":3,"versions":[{{"version":1,"digest":"sha256:{digest}","size_bytes":1843201,"uploaded_at":1767225600,"world":"voicehost:agent@0.3.0","deprecated":false,"active":false}},{{"version":2,"digest":"sha256:{digest}","size_bytes":1843201,"uploaded_at":1767225600,"world":"voicehost:agent@0.3.0","deprecated":false,"active":true}}]}}"#
            ),
        );
        let refused = AgentView {
            agent_id: "agent_new".into(),
            status: AgentStatus::Refused,
            status_detail: Some("Sent refused the connection (401)".into()),
            active_version: None,
            served_version: None,
            failure_policy: FailurePolicy::HangUp,
            live_sessions: 0,
            versions: vec![],
        };
        exactly(
            &AgentList {
                agents: vec![refused],
            },
            r#"{"agents":[{"agent_id":"agent_new","status":"refused","status_detail":"Sent refused the connection (401)","active_version":null,"served_version":null,"failure_policy":{"action":"hangup"},"live_sessions":0,"versions":[]}]}"#,
        );
        exactly(&AgentList { agents: vec![] }, r#"{"agents":[]}"#);
        for status in [
            AgentStatus::Inactive,
            AgentStatus::Loading,
            AgentStatus::Connecting,
            AgentStatus::Serving,
            AgentStatus::Refused,
        ] {
            exactly(&status, &format!("\"{}\"", status.as_str()));
        }
    }

    #[test]
    fn sessions_are_the_json_the_api_has_always_answered() {
        let audio = SessionView {
            session_id: "vs_1".into(),
            call_id: "call_1".into(),
            agent_id: "agent_abc123".into(),
            version: 2,
            direction: Direction::Inbound,
            media: Media::Audio,
            sample_rate: Some(16000),
            started_at: "2026-01-02T15:04:05Z".into(),
            from: PartyView {
                kind: "anonymous".into(),
                value: None,
            },
            to: PartyView {
                kind: "agent".into(),
                value: Some("agent_abc123".into()),
            },
        };
        let text = SessionView {
            direction: Direction::Outbound,
            media: Media::Text,
            sample_rate: None,
            ..audio.clone()
        };
        exactly(
            &SessionList {
                sessions: vec![audio, text],
            },
            r#"{"sessions":[{"session_id":"vs_1","call_id":"call_1","agent_id":"agent_abc123","version":2,"direction":"inbound","media":"audio","sample_rate":16000,"started_at":"2026-01-02T15:04:05Z","from":{"kind":"anonymous","value":null},"to":{"kind":"agent","value":"agent_abc123"}},{"session_id":"vs_1","call_id":"call_1","agent_id":"agent_abc123","version":2,"direction":"outbound","media":"text","sample_rate":null,"started_at":"2026-01-02T15:04:05Z","from":{"kind":"anonymous","value":null},"to":{"kind":"agent","value":"agent_abc123"}}]}"#,
        );
        for direction in [Direction::Inbound, Direction::Outbound] {
            exactly(&direction, &format!("\"{}\"", direction.as_str()));
        }
        for media in [Media::Text, Media::Audio] {
            exactly(&media, &format!("\"{}\"", media.as_str()));
        }
    }

    #[test]
    fn health_errors_and_requests_are_the_json_the_api_has_always_used() {
        exactly(
            &Health::Ok {
                agents: 2,
                loading: 1,
                registry_reachable: None,
            },
            r#"{"status":"ok","agents":2,"loading":1}"#,
        );
        exactly(
            &Health::Ok {
                agents: 2,
                loading: 0,
                registry_reachable: Some(false),
            },
            r#"{"status":"ok","agents":2,"loading":0,"registry_reachable":false}"#,
        );
        exactly(&Health::Starting, r#"{"status":"starting"}"#);
        exactly(
            &ErrorBody::new(ErrorCode::NotFound, "no such route"),
            r#"{"error":{"code":"not_found","message":"no such route"}}"#,
        );
        exactly(&ActivateRequest { version: 3 }, r#"{"version":3}"#);
        assert!(serde_json::from_str::<ActivateRequest>(r#"{"version":3,"now":true}"#).is_err());
        assert!(serde_json::from_str::<ActivateRequest>(r#"{"version":-1}"#).is_err());
    }

    /// `example` reads as a `T` that writes back as the same JSON, key for key and in the same order.
    fn documented<T: Serialize + DeserializeOwned>(example: &serde_json::Value, what: &str) {
        let view: T = serde_json::from_value(example.clone()).expect(what);
        assert_eq!(
            serde_json::to_string(&view).unwrap(),
            example.to_string(),
            "{what}"
        );
    }

    #[test]
    fn the_examples_of_the_api_document_are_these_views() {
        let document = serde_json::to_value(crate::api::openapi()).unwrap();
        let schemas = &document["components"]["schemas"];
        documented::<AgentView>(&schemas["Agent"]["example"], "Agent");
        documented::<VersionView>(&schemas["Version"]["example"], "Version");
        documented::<SessionView>(&schemas["Session"]["example"], "Session");
        let health = &document["paths"]["/healthz"]["get"]["responses"];
        for status in ["200", "503"] {
            let example = &health[status]["content"]["application/json"]["example"];
            documented::<Health>(example, status);
        }
        let responses = document["components"]["responses"].as_object().unwrap();
        assert!(responses.len() >= 6);
        for (name, response) in responses {
            let content = &response["content"]["application/json"];
            let examples: Vec<&serde_json::Value> = match content["examples"].as_object() {
                Some(named) => named.values().map(|e| &e["value"]).collect(),
                None => vec![&content["example"]],
            };
            for example in examples {
                documented::<ErrorBody>(example, name);
            }
        }
    }

    #[test]
    fn every_error_code_is_its_name_on_the_wire() {
        for code in ErrorCode::ALL {
            exactly(&code, &format!("\"{}\"", code.as_str()));
        }
    }

    #[test]
    fn a_newer_hosts_extra_fields_are_ignored_but_a_missing_one_is_an_error() {
        let wire = r#"{"version":1,"digest":"sha256:ab","size_bytes":9,"uploaded_at":0,"active":true,"signed":false}"#;
        assert_eq!(
            serde_json::from_str::<VersionView>(wire).unwrap().digest,
            "sha256:ab"
        );
        let wire = r#"{"version":1,"digest":"sha256:ab","size_bytes":9,"active":true}"#;
        assert!(serde_json::from_str::<VersionView>(wire).is_err());
    }
}
