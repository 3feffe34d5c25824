//! The admin HTTP API (axum, on its own listener): tenants upload, activate, roll back and delete their
//! agents' versions, set failure policies and see their live calls; operators read `/healthz` and
//! `/metrics`. Described for clients in `host/openapi.json`. Handlers are plain functions over the
//! [`Server`]; a tenant is known only by its bearer token, and another tenant's agent is a 404.

pub mod metrics;
#[cfg(test)]
mod tests;
pub mod views;

use crate::call::FailurePolicy;
use crate::sandbox::wit::{self, Direction, Media};
use crate::sandbox::LoadError;
use crate::tenancy::registry::{AgentRecord, RegistryError, VersionRecord};
use crate::tenancy::server::{AgentStatus, ServeError, Server};
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path, RawQuery, State};
use axum::http::{header, request::Parts, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use http_body_util::BodyExt as _;
use metrics::HostCounts;
use std::sync::Arc;
use views::{
    ActivateRequest, AgentList, AgentView, ErrorBody, Health, PartyView, SessionList, SessionView,
    VersionView,
};

/// Declares every route once: the table [`ROUTES`] (what `openapi.json` must describe, checked by a test)
/// and the router's routes come from the same lines.
macro_rules! routes {
    ($($method:ident $path:literal => $handler:ident,)*) => {
        /// Every route, as (method, path): what `openapi.json` must describe.
        pub const ROUTES: &[(&str, &str)] = &[$((stringify!($method), $path)),*];

        fn routes() -> Router<Arc<Server>> {
            // A second method on a path joins the first (axum merges them).
            Router::new()$(.route($path, axum::routing::$method($handler)))*
        }
    };
}

routes! {
    get "/healthz" => healthz,
    get "/metrics" => metrics,
    get "/v1/agents" => list_agents,
    get "/v1/agents/{agent_id}" => show_agent,
    delete "/v1/agents/{agent_id}" => delete_agent,
    post "/v1/agents/{agent_id}/versions" => upload,
    delete "/v1/agents/{agent_id}/versions/{version}" => delete_version,
    post "/v1/agents/{agent_id}/activate" => activate,
    post "/v1/agents/{agent_id}/rollback" => rollback,
    put "/v1/agents/{agent_id}/failure-policy" => set_policy,
    get "/v1/sessions" => sessions,
    get "/v1/metrics" => tenant_metrics,
}

/// The admin API over `server`.
pub fn router(server: Arc<Server>) -> Router {
    routes()
        .fallback(not_found)
        .layer(axum::middleware::from_fn(access_log))
        .with_state(server)
}

/// One line per request: method, path, status, time. Never a header (the token is one).
async fn access_log(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    let (status, took_ms) = (
        response.status().as_u16(),
        started.elapsed().as_millis() as u64,
    );
    // Scrapes and health checks come every few seconds: only at debug.
    if path == "/metrics" || path == "/healthz" {
        tracing::debug!(%method, path, status, took_ms, "admin request");
    } else {
        tracing::info!(%method, path, status, took_ms, "admin request");
    }
    response
}

// ----- errors -----

/// An error answer: its status, and its body ([`ErrorBody`]: `{"error": {"code", "message"}}`).
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(ErrorBody::new(self.code, self.message))).into_response()
    }
}

impl From<ServeError> for ApiError {
    fn from(error: ServeError) -> ApiError {
        let message = error.to_string();
        match error {
            ServeError::BadRequest(_) => ApiError::bad_request(message),
            ServeError::Load(LoadError::NotWasm) => {
                ApiError::new(StatusCode::BAD_REQUEST, "not_wasm", message)
            }
            ServeError::Load(LoadError::CoreModule) => {
                ApiError::new(StatusCode::BAD_REQUEST, "core_module", message)
            }
            ServeError::Load(LoadError::Invalid(_)) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_component", message)
            }
            ServeError::Load(LoadError::WrongWorld(_)) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "wrong_world", message)
            }
            ServeError::Registry(RegistryError::NoAgent(_) | RegistryError::NoVersion { .. }) => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
            }
            ServeError::Registry(RegistryError::Conflict(_)) => {
                ApiError::new(StatusCode::CONFLICT, "conflict", message)
            }
            ServeError::Registry(_) | ServeError::Internal(_) => {
                tracing::error!(error = message, "the admin API failed");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "the host failed; its log says why",
                )
            }
        }
    }
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

// ----- the caller -----

/// The tenant whose admin token came with the request.
pub struct Tenant(String);

impl FromRequestParts<Arc<Server>> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        server: &Arc<Server>,
    ) -> Result<Tenant, ApiError> {
        match bearer(&parts.headers).and_then(|token| server.tenant_by_token(token)) {
            Some(tenant) => Ok(Tenant(tenant)),
            None => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "send a tenant's admin token as `Authorization: Bearer <token>`",
            )),
        }
    }
}

/// The token of an `Authorization: Bearer …` header.
fn bearer(headers: &header::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

// ----- views: the server's records as the API's JSON (the types of `views`) -----

fn agent_view(server: &Server, tenant: &str, agent_id: String, record: AgentRecord) -> AgentView {
    let versions = record
        .versions
        .iter()
        .map(|v| version_view(v, record.active == Some(v.version)))
        .collect();
    let (status, status_detail) = match server.status(tenant, &agent_id) {
        AgentStatus::Inactive => (views::AgentStatus::Inactive, None),
        AgentStatus::Connecting => (views::AgentStatus::Connecting, None),
        AgentStatus::Serving => (views::AgentStatus::Serving, None),
        AgentStatus::Refused(why) => (views::AgentStatus::Refused, Some(why)),
    };
    AgentView {
        status,
        status_detail,
        live_sessions: server.live_sessions(tenant, &agent_id) as u64,
        agent_id,
        active_version: record.active,
        failure_policy: record.failure_policy,
        versions,
    }
}

fn version_view(version: &VersionRecord, active: bool) -> VersionView {
    VersionView {
        version: version.version,
        digest: version.digest.to_string(),
        size_bytes: version.size_bytes,
        uploaded_at: version.uploaded_at,
        active,
    }
}

fn session_view(agent_id: String, version: u32, call: &wit::Call) -> SessionView {
    let party = |p: &wit::Party| PartyView {
        kind: p.kind.clone(),
        value: p.value.clone(),
    };
    let (media, sample_rate) = match call.media {
        Media::Text => (views::Media::Text, None),
        Media::Audio(rate) => (views::Media::Audio, Some(rate)),
    };
    SessionView {
        session_id: call.session_id.clone(),
        call_id: call.call_id.clone(),
        agent_id,
        version,
        direction: match call.direction {
            Direction::Inbound => views::Direction::Inbound,
            Direction::Outbound => views::Direction::Outbound,
        },
        media,
        sample_rate,
        started_at: call.started_at.clone(),
        from: party(&call.from),
        to: party(&call.to),
    }
}

// ----- handlers -----

async fn healthz(State(server): State<Arc<Server>>) -> (StatusCode, Json<Health>) {
    if server.ready() {
        let agents = server.stats().len() as u64;
        (StatusCode::OK, Json(Health::Ok { agents }))
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(Health::Starting))
    }
}

async fn metrics(State(server): State<Arc<Server>>, headers: header::HeaderMap) -> Response {
    if !server.may_read_metrics(bearer(&headers)) {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send the operator's metrics token as `Authorization: Bearer <token>`",
        )
        .into_response();
    }
    let text = metrics::render(
        &server.stats(),
        Some(HostCounts {
            compilations: &server.compilations,
            cache_loads: &server.cache_loads,
        }),
    );
    prometheus(text)
}

/// The tenant's own agents' metrics, nobody else's.
async fn tenant_metrics(State(server): State<Arc<Server>>, Tenant(tenant): Tenant) -> Response {
    let mut stats = server.stats();
    stats.retain(|(owner, _, _)| *owner == tenant);
    prometheus(metrics::render(&stats, None))
}

fn prometheus(text: String) -> Response {
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response()
}

async fn list_agents(State(server): State<Arc<Server>>, Tenant(tenant): Tenant) -> Json<AgentList> {
    let agents = server
        .agents(&tenant)
        .await
        .into_iter()
        .map(|(id, record)| agent_view(&server, &tenant, id, record))
        .collect();
    Json(AgentList { agents })
}

async fn show_agent(
    State(server): State<Arc<Server>>,
    Tenant(tenant): Tenant,
    Path(agent_id): Path<String>,
) -> Result<Json<AgentView>, ApiError> {
    let record = server.agent(&tenant, &agent_id).await?;
    Ok(Json(agent_view(&server, &tenant, agent_id, record)))
}

async fn upload(
    State(server): State<Arc<Server>>,
    Tenant(tenant): Tenant,
    Path(agent_id): Path<String>,
    RawQuery(query): RawQuery,
    body: Body,
) -> Result<(StatusCode, Json<VersionView>), ApiError> {
    let cap = server
        .tenant(&tenant)
        .map(|t| t.agent_limits(&agent_id).component_bytes())
        .unwrap_or(0);
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the component is over this tenant's cap of {cap} bytes"),
        )
    };
    // Read at most one byte past the cap: a huge body is refused without being held.
    let wasm = match http_body_util::Limited::new(body, cap as usize + 1)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        Err(error) => {
            return Err(ApiError::bad_request(format!(
                "the upload broke off: {error}"
            )))
        }
    };
    if wasm.len() as u64 > cap {
        return Err(too_large());
    }
    if wasm.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "not_wasm",
            "the body is empty: send the component's bytes",
        ));
    }
    let activate = match query.as_deref() {
        None | Some("") | Some("activate=false") => false,
        Some("activate=true") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown query {other:?}: only `activate=true` or `activate=false`"
            )))
        }
    };
    let version = server.upload(&tenant, &agent_id, wasm, activate).await?;
    Ok((StatusCode::CREATED, Json(version_view(&version, activate))))
}

async fn activate(
    State(server): State<Arc<Server>>,
    Tenant(tenant): Tenant,
    Path(agent_id): Path<String>,
    body: Bytes,
) -> Result<Json<AgentView>, ApiError> {
    let ActivateRequest { version } = parse_json(&body)?;
    let record = server.activate(&tenant, &agent_id, version).await?;
    Ok(Json(agent_view(&server, &tenant, agent_id, record)))
}

async fn rollback(
    State(server): State<Arc<Server>>,
    Tenant(tenant): Tenant,
    Path(agent_id): Path<String>,
) -> Result<Json<AgentView>, ApiError> {
    let record = server.rollback(&tenant, &agent_id).await?;
    Ok(Json(agent_view(&server, &tenant, agent_id, record)))
}

async fn set_policy(
    State(server): State<Arc<Server>>,
    Tenant(tenant): Tenant,
    Path(agent_id): Path<String>,
    body: Bytes,
) -> Result<Json<AgentView>, ApiError> {
    let policy: FailurePolicy = parse_json(&body)?;
    let record = server.set_policy(&tenant, &agent_id, policy).await?;
    Ok(Json(agent_view(&server, &tenant, agent_id, record)))
}

async fn delete_version(
    State(server): State<Arc<Server>>,
    Tenant(tenant): Tenant,
    Path((agent_id, version)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let version: u32 = version
        .parse()
        .map_err(|_| ApiError::bad_request(format!("{version:?} is not a version number")))?;
    server.delete_version(&tenant, &agent_id, version).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn delete_agent(
    State(server): State<Arc<Server>>,
    Tenant(tenant): Tenant,
    Path(agent_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    server.delete_agent(&tenant, &agent_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn sessions(State(server): State<Arc<Server>>, Tenant(tenant): Tenant) -> Json<SessionList> {
    let sessions = server
        .sessions(&tenant)
        .into_iter()
        .map(|(agent_id, live)| session_view(agent_id, live.version, &live.call))
        .collect();
    Json(SessionList { sessions })
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the body: {e}")))
}
