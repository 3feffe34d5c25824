//! The admin HTTP API (axum, on its own listener): tenants upload, activate, roll back and delete their
//! agents' versions, set failure policies and see their live calls; operators read `/healthz` and
//! `/metrics`. Handlers are plain functions over the [`Tenancy`]; a tenant is known only by its bearer
//! token, and another tenant's agent is a 404. Each handler's `#[utoipa::path]` describes it, so the
//! OpenAPI document ([`openapi`], served at `/openapi.json`) is generated from the routes and the
//! [`views`]' types.

mod body;
mod doc;
pub mod listener;
mod metrics;
#[cfg(test)]
mod tests;
pub mod views;

use crate::sandbox::wit::{self, Direction};
use crate::sandbox::{blocking, LoadError};
use crate::tenancy::{
    AgentRecord, RegistryError, ServeError, StoreError, Tenancy, TokenHash, VersionRecord,
    MAX_TOKEN_BYTES,
};
use axum::body::Body;
use axum::extract::{FromRequestParts, Path, RawQuery, State};
use axum::http::{header, request::Parts, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use body::BodyError;
use doc::{AgentPath, VersionPath};
pub use metrics::{render as render_metrics, HostCounts, CONTENT_TYPE as METRICS_CONTENT_TYPE};
use std::sync::Arc;
use utoipa::OpenApi as _;
use utoipa_axum::{router::OpenApiRouter, routes};
use views::{
    ActivateRequest, AgentList, AgentView, ErrorBody, ErrorCode, Health, PartyView, SessionList,
    SessionView, UsageView, VersionView,
};
use voicehost_proto::call::{self, FailurePolicy};

/// The routes and the document they make: each handler's `#[utoipa::path]` gives its method and path to
/// both, so a route cannot exist undocumented or be documented and absent.
fn routes() -> OpenApiRouter<Arc<Tenancy>> {
    OpenApiRouter::with_openapi(doc::Front::openapi())
        .routes(routes!(healthz))
        .routes(routes!(metrics))
        .routes(routes!(openapi_json))
        .routes(routes!(list_agents))
        .routes(routes!(show_agent, delete_agent))
        .routes(routes!(upload))
        .routes(routes!(delete_version))
        .routes(routes!(activate))
        .routes(routes!(rollback))
        .routes(routes!(set_policy))
        .routes(routes!(sessions))
        .routes(routes!(usage))
        .routes(routes!(tenant_metrics))
}

/// The admin API over `tenancy`.
pub fn router(tenancy: Arc<Tenancy>) -> Router {
    let (router, _) = routes().split_for_parts();
    router
        .fallback(not_found)
        .layer(axum::middleware::from_fn(access_log))
        .with_state(tenancy)
}

/// Serves the admin API of `tenancy` on `listener` under the config's `[admin]` limits, in TLS with
/// `tls`'s certificate when given, until `stop` resolves, then lets the requests in progress finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tenancy: Arc<Tenancy>,
    admin: &crate::tenancy::AdminConfig,
    tls: Option<Arc<crate::tls::ServerCert>>,
    stop: impl std::future::Future<Output = ()>,
) {
    let refused = tenancy.admin_refused.clone();
    let turned_away = {
        let tenancy = tenancy.clone();
        move |client| tenancy.login_refused(Some(client)).is_some()
    };
    listener::serve(
        listener,
        router(tenancy),
        admin.into(),
        tls,
        turned_away,
        move || {
            refused.inc();
        },
        stop,
    )
    .await;
}

/// The wiring of `voicehost serve`, one function for the binary, the demo and the tests: serves the admin
/// API of `tenancy` ([`serve`]) in a task of its own until `stop`, then starts the tenancy's agents
/// (`/healthz` answers 503 until those in the compiled cache are served). The task ends once the API has
/// stopped.
pub async fn start_serving(
    tenancy: &Arc<Tenancy>,
    listener: tokio::net::TcpListener,
    admin: &crate::tenancy::AdminConfig,
    tls: Option<Arc<crate::tls::ServerCert>>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let api = tokio::spawn({
        let (tenancy, admin) = (tenancy.clone(), admin.clone());
        async move { serve(listener, tenancy, &admin, tls, stop).await }
    });
    tenancy.start().await;
    api
}

/// The admin API's OpenAPI document (served at `/openapi.json`; `host/openapi.json` is this, written out).
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut document = routes().into_openapi();
    doc::finish(&mut document);
    document
}

/// How much of a request's path the access log keeps, in characters.
const MAX_LOGGED_PATH: usize = 200;

/// One line per request: method, path, status, time. Never a header (the token is one).
async fn access_log(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path());
    // A client may send a path of hundreds of kilobytes: the log keeps its start.
    let path = match path.char_indices().nth(MAX_LOGGED_PATH) {
        Some((at, _)) => format!("{}…", &path[..at]),
        None => path.to_string(),
    };
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    let (status, took_ms) = (
        response.status().as_u16(),
        started.elapsed().as_millis() as u64,
    );
    // Scrapes and health checks come every few seconds, refusals for rate as fast as a client sends
    // them: only at debug.
    if path == "/metrics" || path == "/healthz" || status == 429 {
        tracing::debug!(%method, path, status, took_ms, "admin request");
    } else {
        tracing::info!(%method, path, status, took_ms, "admin request");
    }
    response
}

// ----- errors -----

/// An error answer: its code (which gives its status) and message, as an [`ErrorBody`].
#[derive(Debug)]
pub struct ApiError {
    code: ErrorCode,
    message: String,
    /// Seconds until the client may try again (`Retry-After`), for a `busy` answer.
    retry_after: Option<u64>,
    /// The connection closes after this answer (a failed login: a client without a token holds no
    /// connection open by asking again and again on it).
    close: bool,
}

impl ApiError {
    fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
            retry_after: None,
            close: false,
        }
    }

    /// `408 timeout`: the body did not arrive within `deadline`; nothing of it was kept.
    fn too_slow(deadline: std::time::Duration) -> ApiError {
        ApiError::new(
            ErrorCode::Timeout,
            format!(
                "the body did not arrive within {} s: nothing was kept",
                deadline.as_secs()
            ),
        )
    }

    /// `429 busy`, to try again after `wait` (rounded up to whole seconds).
    fn busy(message: impl Into<String>, wait: std::time::Duration) -> ApiError {
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        ApiError {
            retry_after: Some(seconds.max(1)),
            ..ApiError::new(ErrorCode::Busy, message)
        }
    }

    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::BadRequest, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, Json(ErrorBody::new(self.code, self.message))).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
        }
        if self.close {
            response.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
        }
        response
    }
}

/// When a tenant with all its uploads in progress may try again (`Retry-After`).
const RETRY_BUSY: std::time::Duration = std::time::Duration::from_secs(5);

impl From<ServeError> for ApiError {
    fn from(error: ServeError) -> ApiError {
        let message = error.to_string();
        match (&error, error_code(&error)) {
            (ServeError::Busy(_), _) => ApiError::busy(message, RETRY_BUSY),
            (ServeError::CompileTimeSpent { wait, .. }, _) => ApiError::busy(message, *wait),
            (_, ErrorCode::Internal) => {
                tracing::error!(error = message, "the admin API failed");
                ApiError::new(ErrorCode::Internal, "the host failed; its log says why")
            }
            (_, code) => ApiError::new(code, message),
        }
    }
}

/// The code the admin API answers `error` with (its status is the code's): `voicehost check` says the
/// same of a component as an upload's answer would.
pub fn error_code(error: &ServeError) -> ErrorCode {
    match error {
        ServeError::Busy(_) | ServeError::CompileTimeSpent { .. } => ErrorCode::Busy,
        ServeError::BadRequest(_) => ErrorCode::BadRequest,
        ServeError::Load(LoadError::NotWasm) => ErrorCode::NotWasm,
        ServeError::Load(LoadError::CoreModule) => ErrorCode::CoreModule,
        ServeError::Load(LoadError::Invalid(_)) => ErrorCode::InvalidComponent,
        ServeError::Load(LoadError::WrongWorld(_)) => ErrorCode::WrongWorld,
        ServeError::OverLimits(_)
        | ServeError::Load(LoadError::TooCostly(_) | LoadError::OverInstanceLimits(_)) => {
            ErrorCode::OverLimits
        }
        ServeError::Registry(RegistryError::NoAgent(_) | RegistryError::NoVersion { .. }) => {
            ErrorCode::NotFound
        }
        ServeError::Registry(RegistryError::Conflict(_)) => ErrorCode::Conflict,
        ServeError::Registry(RegistryError::Store(StoreError::Unavailable(_))) => {
            ErrorCode::Unavailable
        }
        ServeError::OverQuota(_) => ErrorCode::OverQuota,
        ServeError::NoTenant(_) => ErrorCode::Unauthorized,
        ServeError::Registry(_)
        | ServeError::Internal(_)
        | ServeError::Load(LoadError::Compiler(_)) => ErrorCode::Internal,
    }
}

/// The answer to an upload with an empty body.
pub const EMPTY_UPLOAD: &str = "the body is empty: send the component's bytes";

/// The answer to an upload over the agent's `component_mib`, of `cap` bytes.
pub fn too_large_message(cap: u64) -> String {
    format!("the component is over this tenant's cap of {cap} bytes")
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such route")
}

// ----- the caller -----

/// The tenant whose admin token came with the request.
pub struct Tenant(String);

impl FromRequestParts<Arc<Tenancy>> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        tenancy: &Arc<Tenancy>,
    ) -> Result<Tenant, ApiError> {
        let what = "send a tenant's admin token as `Authorization: Bearer <token>`";
        let presented = presented_token(tenancy, parts, what)?;
        match presented.and_then(|token| tenancy.tenant_by_token(&token)) {
            Some(tenant) => {
                tenancy.request(&tenant).map_err(|wait| {
                    ApiError::busy(
                        "this tenant asks faster than its `requests_per_second`: slow down",
                        wait,
                    )
                })?;
                Ok(Tenant(tenant))
            }
            None => Err(failed_login(tenancy, parts, what)),
        }
    }
}

/// The hash of the request's bearer token (`None` without one), computed once, and only for a client not
/// refused for failing too often: a refused client is answered 429 first, and a token longer than any the
/// host holds ([`MAX_TOKEN_BYTES`]) is a failed login, unhashed. So a request without a valid token costs
/// the host at most one hash of at most 256 bytes.
fn presented_token(
    tenancy: &Tenancy,
    parts: &Parts,
    what: &str,
) -> Result<Option<TokenHash>, ApiError> {
    if let Some(wait) = tenancy.login_refused(client(parts)) {
        return Err(too_many_failed_logins(wait));
    }
    let Some(token) = bearer(&parts.headers) else {
        return Ok(None);
    };
    match TokenHash::of_presented(token) {
        Some(hash) => Ok(Some(hash)),
        None => Err(failed_login(
            tenancy,
            parts,
            &format!("{what}: this one is longer than any token the host holds ({MAX_TOKEN_BYTES} bytes)"),
        )),
    }
}

/// The key the failed-login limit counts the request's client under.
fn client(parts: &Parts) -> Option<std::net::IpAddr> {
    listener::client_of(parts).map(|addr| listener::client_key(addr.ip()))
}

fn too_many_failed_logins(wait: std::time::Duration) -> ApiError {
    ApiError {
        close: true,
        ..ApiError::busy(
            "too many failed logins from this address: wait before trying again",
            wait,
        )
    }
}

/// The answer to a request without a token the host knows: 401, or 429 once its client address has failed
/// `failed_logins_per_minute` times.
fn failed_login(tenancy: &Tenancy, parts: &Parts, what: &str) -> ApiError {
    match tenancy.failed_login(client(parts)) {
        Ok(()) => ApiError {
            close: true,
            ..ApiError::new(ErrorCode::Unauthorized, what)
        },
        Err(wait) => too_many_failed_logins(wait),
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

// ----- views: the tenancy's records as the API's JSON (the types of `views`) -----

fn agent_view(tenancy: &Tenancy, tenant: &str, agent_id: String, record: AgentRecord) -> AgentView {
    let versions = record
        .versions
        .iter()
        .map(|v| version_view(v, record.active == Some(v.version)))
        .collect();
    let (status, status_detail) = tenancy.status(tenant, &agent_id);
    let served_version = tenancy.served_version(tenant, &agent_id);
    AgentView {
        status,
        status_detail,
        live_sessions: tenancy.live_sessions(tenant, &agent_id) as u64,
        agent_id,
        active_version: record.active,
        served_version,
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
        world: version.world,
        deprecated: version.world.deprecated(),
        active,
    }
}

// The API's JSON names a call's media by its kind and gives an audio call's rate beside it
// (`sample_rate`), so its `Media` is the kind alone: made from the core's `Media` here, and only here.
impl From<call::Media> for views::Media {
    fn from(media: call::Media) -> views::Media {
        match media {
            call::Media::Text => views::Media::Text,
            call::Media::Audio { .. } => views::Media::Audio,
        }
    }
}

fn session_view(agent_id: String, version: u32, info: &wit::CallInfo) -> SessionView {
    let party = |p: &wit::Party| PartyView {
        kind: p.kind.clone(),
        value: p.value.clone(),
    };
    let media = call::Media::from(info.media);
    SessionView {
        session_id: info.session_id.clone(),
        call_id: info.call_id.clone(),
        agent_id,
        version,
        direction: match info.direction {
            Direction::Inbound => views::Direction::Inbound,
            Direction::Outbound => views::Direction::Outbound,
        },
        media: media.into(),
        sample_rate: media.sample_rate(),
        started_at: info.started_at.clone(),
        from: party(&info.from),
        to: party(&info.to),
    }
}

// ----- handlers -----

/// Is the host ready to serve calls?
///
/// For load balancers and process supervisors. `200` once the registry of agents has loaded and every
/// agent whose compiled form the host holds is served, with the number of agents being served and of
/// those still waiting for their version to compile (after an upgrade emptied the compiled cache: each
/// is served as soon as it is compiled, and its tenant sees it as `loading`); `503` before.
#[utoipa::path(get, path = "/healthz", tag = "host", operation_id = "health", security(()),
    responses(
        (status = 200, description = "The host is serving.", body = Health,
            example = json!({"status": "ok", "agents": 12, "loading": 0})),
        (status = 503, description = "The host is still loading its registry of agents; try again \
            shortly.", body = Health, example = json!({"status": "starting"})),
    ))]
async fn healthz(State(tenancy): State<Arc<Tenancy>>) -> (StatusCode, Json<Health>) {
    if tenancy.ready() {
        let agents = tenancy.stats().len() as u64;
        let loading = tenancy.loading_count() as u64;
        let registry_reachable = tenancy.clustered().then(|| tenancy.registry_reachable());
        let health = Health::Ok {
            agents,
            loading,
            registry_reachable,
        };
        (StatusCode::OK, Json(health))
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(Health::Starting))
    }
}

/// Prometheus metrics
///
/// What the host counted (sessions, frames, audio, resumes, traps contained, instance restarts and so
/// on), labelled by tenant and agent, in the OpenMetrics 1.0 text format (which Prometheus scrapes). It
/// names every tenant's agents: when the config sets `[admin] metrics_token_sha256`, it needs the
/// operator's metrics token as a bearer token (a tenant's token is refused); otherwise only a client on
/// the host's own machine (a loopback address) may read it.
#[utoipa::path(get, path = "/metrics", tag = "host", operation_id = "metrics",
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The metrics.", body = String,
            content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"),
        (status = 401, description = "The config sets a metrics token and the request did not carry \
            it, or sets none and the request came from another machine.", body = ErrorBody),
    ))]
async fn metrics(State(tenancy): State<Arc<Tenancy>>, request: axum::extract::Request) -> Response {
    let (parts, _) = request.into_parts();
    let what = "send the operator's metrics token as `Authorization: Bearer <token>`";
    // Read once: a reload between two reads must not leave the request with neither check.
    if let Some(operators) = tenancy.metrics_token() {
        let presented = match presented_token(&tenancy, &parts, what) {
            Ok(presented) => presented,
            Err(refused) => return refused.into_response(),
        };
        if !presented.is_some_and(|presented| operators.matches(&presented)) {
            return failed_login(&tenancy, &parts, what).into_response();
        }
    } else if listener::client_of(&parts)
        .is_some_and(|addr| !addr.ip().to_canonical().is_loopback())
    {
        // They name every tenant's agents: without a token, only this machine reads them.
        return ApiError::new(
            ErrorCode::Unauthorized,
            "without `[admin] metrics_token_sha256` in the host's config, the metrics are read only \
             from the host's own machine",
        )
        .into_response();
    }
    rendered(&tenancy, None).await
}

/// The tenant's own metrics
///
/// The same series as `/metrics`, labelled by tenant and agent, for the calling tenant's agents only
/// (without the host-wide `voicehost_agents_served`, `voicehost_compilations_total` and
/// `voicehost_compiled_cache_loads_total`). OpenMetrics 1.0 text format; the tenant's token as a bearer
/// token.
#[utoipa::path(get, path = "/v1/metrics", tag = "sessions", operation_id = "tenantMetrics",
    responses(
        (status = 200, description = "The tenant's metrics.", body = String,
            content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"),
        (status = 401, response = doc::Unauthorized),
        (status = 429, description = "`busy`: the tenant's metrics were rendered less than a second \
            ago, or the tenant asks faster than it may (`Retry-After` says when to ask again).",
            body = ErrorBody),
    ))]
async fn tenant_metrics(State(tenancy): State<Arc<Tenancy>>, Tenant(tenant): Tenant) -> Response {
    rendered(&tenancy, Some(&tenant)).await
}

/// The metrics of `tenant`'s agents (every agent's and the host's when `None`), rendered on a blocking
/// thread (about 80 µs per agent); a tenant's once a second at most.
async fn rendered(tenancy: &Arc<Tenancy>, tenant: Option<&str>) -> Response {
    if let Some(Err(wait)) = tenant.map(|tenant| tenancy.metrics_render(tenant)) {
        return ApiError::busy(
            "this tenant's metrics were rendered less than a second ago: ask again after \
             `Retry-After`",
            wait,
        )
        .into_response();
    }
    let mut stats = tenancy.stats();
    if let Some(tenant) = tenant {
        stats.retain(|(owner, _, _)| owner == tenant);
    }
    let (host, operator) = (tenancy.clone(), tenant.is_none());
    let text = blocking(move || {
        let counts = operator.then(|| HostCounts {
            compilations: &host.compilations,
            cache_loads: &host.cache_loads,
            admin_refused: &host.admin_refused,
            cluster: host
                .clustered()
                .then(|| (host.registry_reachable(), &host.cluster_changes)),
        });
        metrics::render(&stats, counts)
    })
    .await;
    match text {
        Ok(text) => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response(),
        Err(error) => ApiError::from(ServeError::from(error)).into_response(),
    }
}

/// List the tenant's agents
///
/// Every agent of the tenant whose token made the request, each with its versions.
#[utoipa::path(get, path = "/v1/agents", tag = "agents", operation_id = "listAgents",
    responses(
        (status = 200, description = "The tenant's agents (an empty list if it has none).",
            body = AgentList),
        (status = 401, response = doc::Unauthorized),
        (status = 500, response = doc::Internal),
    ))]
async fn list_agents(
    State(tenancy): State<Arc<Tenancy>>,
    Tenant(tenant): Tenant,
) -> Json<AgentList> {
    let agents = tenancy
        .agents(&tenant)
        .await
        .into_iter()
        .map(|(id, record)| agent_view(&tenancy, &tenant, id, record))
        .collect();
    Json(AgentList { agents })
}

/// Show one agent
///
/// The agent, its active version, failure policy, number of live calls and all its versions.
#[utoipa::path(get, path = "/v1/agents/{agent_id}", tag = "agents", operation_id = "getAgent",
    params(AgentPath),
    responses(
        (status = 200, description = "The agent.", body = AgentView),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 500, response = doc::Internal),
    ))]
async fn show_agent(
    State(tenancy): State<Arc<Tenancy>>,
    Tenant(tenant): Tenant,
    Path(AgentPath { agent_id }): Path<AgentPath>,
) -> Result<Json<AgentView>, ApiError> {
    let record = tenancy.agent(&tenant, &agent_id).await?;
    Ok(Json(agent_view(&tenancy, &tenant, agent_id, record)))
}

/// Upload a component as the agent's next version
///
/// The body is the component itself, the raw bytes of the `.wasm` file (a WebAssembly component for the
/// `voicehost:agent` world, e.g. built for `wasm32-wasip2`). The host compiles it and checks its imports
/// and exports against the world before it stores anything; large components can take several seconds
/// to compile. The first upload for an agent id creates the agent, with the `hangup` failure policy.
///
/// Without `activate=true` the new version is stored but serves no calls until it is activated.
#[utoipa::path(post, path = "/v1/agents/{agent_id}/versions", tag = "agents",
    operation_id = "uploadVersion",
    params(AgentPath, doc::UploadQuery),
    request_body(content = inline(doc::WasmFile), content_type = "application/wasm",
        description = "The component's bytes; an empty body is `400 not_wasm`."),
    responses(
        (status = 201, description = "The component was accepted and stored as a new version.",
            body = VersionView),
        (status = 400, response = doc::UploadRejected),
        (status = 401, response = doc::Unauthorized),
        (status = 408, response = doc::UploadRejected),
        (status = 409, response = doc::UploadRejected),
        (status = 413, response = doc::UploadRejected),
        (status = 422, response = doc::UploadRejected),
        (status = 429, response = doc::UploadRejected),
        (status = 500, response = doc::Internal),
    ))]
async fn upload(
    State(tenancy): State<Arc<Tenancy>>,
    Tenant(tenant): Tenant,
    Path(AgentPath { agent_id }): Path<AgentPath>,
    RawQuery(query): RawQuery,
    body: Body,
) -> Result<(StatusCode, Json<VersionView>), ApiError> {
    // Taken before the body is read: a tenant holding uploads open holds only its own slots.
    let _slot = tenancy.upload_slot(&tenant)?;
    let cap = tenancy
        .tenant(&tenant)
        .map(|t| t.agent_limits(&agent_id).component_bytes())
        .unwrap_or(0);
    let too_large = || ApiError::new(ErrorCode::TooLarge, too_large_message(cap));
    let activate = match query.as_deref() {
        None | Some("") | Some("activate=false") => false,
        Some("activate=true") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown query {other:?}: only `activate=true` or `activate=false`"
            )))
        }
    };
    // Refused before the body is read when the agent id, or the tenant's quota, already refuses it.
    tenancy.upload_may_start(&tenant, &agent_id).await?;
    // A body over the cap is refused without being kept; a slow one is given up at the deadline. It is
    // received into a file, never held in memory; an upload refused or abandoned leaves no file.
    let timeout = tenancy.upload_timeout();
    let spool = tenancy.spool().await?;
    let wasm = match body::spool(body, cap, timeout, spool).await {
        Ok(wasm) => wasm,
        Err(BodyError::TooLarge) => return Err(too_large()),
        Err(BodyError::TooSlow) => return Err(ApiError::too_slow(timeout)),
        Err(BodyError::BrokenOff(why)) => {
            return Err(ApiError::bad_request(format!(
                "the upload broke off: {why}"
            )))
        }
        Err(BodyError::Unwritable(why)) => {
            tracing::error!(tenant, error = why, "an upload could not be written down");
            return Err(ApiError::new(
                ErrorCode::Internal,
                "the host could not store the upload; its log says why",
            ));
        }
    };
    if wasm.size() == 0 {
        return Err(ApiError::new(ErrorCode::NotWasm, EMPTY_UPLOAD));
    }
    let version = tenancy.upload(&tenant, &agent_id, wasm, activate).await?;
    Ok((StatusCode::CREATED, Json(version_view(&version, activate))))
}

/// Make a version the active one
///
/// Calls that start from now on get this version; calls already in progress finish on the version they
/// started with. The version that was active until now is remembered for `rollback`.
#[utoipa::path(post, path = "/v1/agents/{agent_id}/activate", tag = "agents",
    operation_id = "activateVersion",
    params(AgentPath),
    request_body(content = ActivateRequest, example = json!({"version": 3})),
    responses(
        (status = 200, description = "The agent, with the version now active.", body = AgentView),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 422, response = doc::OverLimits),
        (status = 429, description = "`busy`: the version must be compiled and the tenant's compiles \
            have used its compile time per hour (`Retry-After` says when it has some again).",
            body = ErrorBody),
        (status = 500, response = doc::Internal),
    ))]
async fn activate(
    State(tenancy): State<Arc<Tenancy>>,
    Tenant(tenant): Tenant,
    Path(AgentPath { agent_id }): Path<AgentPath>,
    body: Body,
) -> Result<Json<AgentView>, ApiError> {
    let ActivateRequest { version } = parse_json(body).await?;
    let record = tenancy.activate(&tenant, &agent_id, version).await?;
    Ok(Json(agent_view(&tenancy, &tenant, agent_id, record)))
}

/// Go back to the previously active version
///
/// Activates the version that was active before the current one. As with `activate`, new calls get it
/// and live calls finish on theirs. The host remembers the versions that were active, in order: each
/// rollback goes one step further back, skipping versions deleted since. `409 conflict` when there is
/// nothing left to roll back to.
#[utoipa::path(post, path = "/v1/agents/{agent_id}/rollback", tag = "agents",
    operation_id = "rollback",
    params(AgentPath),
    responses(
        (status = 200, description = "The agent, with the previous version active again.",
            body = AgentView),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 422, response = doc::OverLimits),
        (status = 429, description = "`busy`: the version must be compiled and the tenant's compiles \
            have used its compile time per hour (`Retry-After` says when it has some again).",
            body = ErrorBody),
        (status = 500, response = doc::Internal),
    ))]
async fn rollback(
    State(tenancy): State<Arc<Tenancy>>,
    Tenant(tenant): Tenant,
    Path(AgentPath { agent_id }): Path<AgentPath>,
) -> Result<Json<AgentView>, ApiError> {
    let record = tenancy.rollback(&tenant, &agent_id).await?;
    Ok(Json(agent_view(&tenancy, &tenant, agent_id, record)))
}

/// Choose what happens to a call the agent cannot serve
///
/// A call gets the agent's failure policy, without going on with the agent, when the agent keeps trapping
/// during it (by default 3 traps within 60 seconds; after each single trap the host goes on with a fresh
/// instance), when the call would be over a session cap of the tenant or agent, or when the agent cannot
/// keep up with Sent. The policy is to hang up, or to transfer the call, e.g. to a person's phone number.
/// It applies to calls from now on.
#[utoipa::path(put, path = "/v1/agents/{agent_id}/failure-policy", tag = "agents",
    operation_id = "setFailurePolicy",
    params(AgentPath),
    request_body(content = FailurePolicy, examples(
        ("hangup" = (summary = "End the call", value = json!({"action": "hangup"}))),
        ("transfer" = (summary = "Transfer the call to a phone number", value = json!(
            {"action": "transfer", "to": {"kind": "number", "value": "+14155550100"}}))),
    )),
    responses(
        (status = 200, description = "The agent, with its new failure policy.", body = AgentView),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 500, response = doc::Internal),
    ))]
async fn set_policy(
    State(tenancy): State<Arc<Tenancy>>,
    Tenant(tenant): Tenant,
    Path(AgentPath { agent_id }): Path<AgentPath>,
    body: Body,
) -> Result<Json<AgentView>, ApiError> {
    let policy: FailurePolicy = parse_json(body).await?;
    let record = tenancy.set_policy(&tenant, &agent_id, policy).await?;
    Ok(Json(agent_view(&tenancy, &tenant, agent_id, record)))
}

/// Delete one version
///
/// Deletes a version that is not active. The active version cannot be deleted (`409 conflict`): activate
/// another version first, or delete the whole agent.
#[utoipa::path(delete, path = "/v1/agents/{agent_id}/versions/{version}", tag = "agents",
    operation_id = "deleteVersion",
    params(VersionPath),
    responses(
        (status = 204, description = "The version is gone."),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 500, response = doc::Internal),
    ))]
async fn delete_version(
    State(tenancy): State<Arc<Tenancy>>,
    Tenant(tenant): Tenant,
    Path(VersionPath { agent_id, version }): Path<VersionPath>,
) -> Result<StatusCode, ApiError> {
    let version: u32 = version
        .parse()
        .map_err(|_| ApiError::bad_request(format!("{version:?} is not a version number")))?;
    tenancy.delete_version(&tenant, &agent_id, version).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Delete an agent and all its versions
///
/// The host stops serving the agent: its connections to Sent close, and its live calls go to the
/// fallback configured at Sent. All its versions are deleted.
#[utoipa::path(delete, path = "/v1/agents/{agent_id}", tag = "agents", operation_id = "deleteAgent",
    params(AgentPath),
    responses(
        (status = 204, description = "The agent is gone."),
        (status = 401, response = doc::Unauthorized),
        (status = 404, response = doc::NotFound),
        (status = 500, response = doc::Internal),
    ))]
async fn delete_agent(
    State(tenancy): State<Arc<Tenancy>>,
    Tenant(tenant): Tenant,
    Path(AgentPath { agent_id }): Path<AgentPath>,
) -> Result<StatusCode, ApiError> {
    tenancy.delete_agent(&tenant, &agent_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// List the tenant's live calls
///
/// Every call in progress on any of the tenant's agents, with the version serving it.
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", operation_id = "listSessions",
    responses(
        (status = 200, description = "The live calls (an empty list if there are none).",
            body = SessionList),
        (status = 401, response = doc::Unauthorized),
        (status = 500, response = doc::Internal),
    ))]
async fn sessions(
    State(tenancy): State<Arc<Tenancy>>,
    Tenant(tenant): Tenant,
) -> Json<SessionList> {
    let sessions = tenancy
        .sessions(&tenant)
        .into_iter()
        .map(|(agent_id, live)| session_view(agent_id, live.version, &live.info))
        .collect();
    Json(SessionList { sessions })
}

/// What the tenant keeps, and its quota
///
/// Its versions across all its agents, the bytes of the components they hold (each once) and of their
/// compiled forms, beside the quota an upload may not pass.
#[utoipa::path(get, path = "/v1/usage", tag = "agents", operation_id = "getUsage",
    responses(
        (status = 200, description = "Usage and quota.", body = UsageView),
        (status = 401, response = doc::Unauthorized),
    ))]
async fn usage(State(tenancy): State<Arc<Tenancy>>, Tenant(tenant): Tenant) -> Json<UsageView> {
    Json(UsageView {
        usage: tenancy.usage(&tenant).await,
        quota: tenancy.quota(&tenant),
    })
}

/// This document
///
/// The admin API's OpenAPI 3.1 document, generated from the host's own routes and types.
#[utoipa::path(get, path = "/openapi.json", tag = "host", operation_id = "openapi", security(()),
    responses((status = 200, description = "The document.", content_type = "application/json")))]
async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(openapi())
}

async fn parse_json<T: serde::de::DeserializeOwned>(body: Body) -> Result<T, ApiError> {
    let body = match body::read(body, JSON_BODY_BYTES, JSON_BODY_TIME).await {
        Ok(body) => body,
        Err(BodyError::TooLarge) => {
            return Err(ApiError::new(
                ErrorCode::TooLarge,
                format!("the body is over {JSON_BODY_BYTES} bytes"),
            ))
        }
        Err(BodyError::TooSlow) => return Err(ApiError::too_slow(JSON_BODY_TIME)),
        // (Only a file can be unwritable; this body is read into memory.)
        Err(BodyError::BrokenOff(why) | BodyError::Unwritable(why)) => {
            return Err(ApiError::bad_request(why))
        }
    };
    serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("the body: {e}")))
}

/// The largest JSON body a route takes (an activation, a failure policy: a few hundred bytes).
const JSON_BODY_BYTES: usize = 64 << 10;
/// How long a JSON body may take to arrive.
const JSON_BODY_TIME: std::time::Duration = std::time::Duration::from_secs(10);
