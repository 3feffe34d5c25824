//! The OpenAPI document's parts that belong to no one handler or view: its front matter (`openapi.md`),
//! tags, the bearer scheme, the path parameters, and the error answers many operations share. The
//! operations come from the handlers' `#[utoipa::path]` and the schemas from the views' `ToSchema`;
//! [`super::openapi`] puts them together and [`finish`]es it, and `host/openapi.json` is that document written out (a test
//! keeps it current).

use super::views::{ErrorBody, ErrorCode};
use serde::Deserialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi, ToResponse, ToSchema};

/// The document's front matter; the operations and schemas are added by the router.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "voicehost admin API",
        version = "1",
        description = include_str!("openapi.md"),
    ),
    servers((
        url = "http://127.0.0.1:7070",
        description = "The default admin address of `voicehost serve`: plain HTTP on loopback. A host \
            given a certificate (`[admin] tls_cert`) serves HTTPS on any address instead."
    )),
    security(("bearer" = [])),
    tags(
        (name = "agents", description = "A tenant's agents, their versions and failure policy."),
        (name = "sessions", description = "The tenant's live calls and metrics."),
        (name = "host", description = "The host's own health, metrics and this document: no tenant \
            token (metrics may need the operator's token)."),
    ),
    components(responses(Unauthorized, NotFound, BadRequest, UploadRejected, Conflict, Internal)),
)]
pub struct Front;

/// What is added once the routes have added their operations and schemas.
pub fn finish(document: &mut utoipa::openapi::OpenApi) {
    Bearer.modify(document);
    ErrorCodes.modify(document);
}

/// Adds the `bearer` scheme every `/v1` operation names.
struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(
                "The tenant's admin token, as `Authorization: Bearer <token>`. It identifies the \
                 tenant. The host keeps only the token's SHA-256, so a lost token cannot be \
                 recovered: the operator makes a new one (`voicehost token new`).",
            ))
            .build();
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme("bearer", SecurityScheme::Http(scheme));
    }
}

/// Adds to `ErrorCode`'s description the status each code goes with, from [`ErrorCode::status`].
struct ErrorCodes;

impl Modify for ErrorCodes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{RefOr, Schema};
        let components = openapi.components.get_or_insert_with(Default::default);
        let Some(RefOr::T(Schema::Object(codes))) = components.schemas.get_mut("ErrorCode") else {
            return;
        };
        let mut table = String::from("\n\n| code | status |\n|---|---|\n");
        for code in ErrorCode::ALL {
            table.push_str(&format!("| `{}` | {} |\n", code.as_str(), code.status()));
        }
        codes.description = Some(codes.description.take().unwrap_or_default() + &table);
    }
}

/// The path of one agent's operations.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct AgentPath {
    /// The agent's id as Sent knows it: `agent_` then letters, digits or `-`, at most 64 in all.
    /// Uploading under an id of any other form is `400 bad_request`; elsewhere such an id names no agent
    /// (`404 not_found`).
    #[param(pattern = r"^agent_[A-Za-z0-9-]{1,58}$", example = "agent_abc123")]
    pub agent_id: String,
}

/// The path of one version's operations. The version is read as text so that a bad one gets this API's
/// own `400 bad_request`.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct VersionPath {
    /// The agent's id as Sent knows it.
    #[param(pattern = r"^agent_[A-Za-z0-9-]{1,58}$", example = "agent_abc123")]
    pub agent_id: String,
    /// A version number of the agent (from 1). Anything but a positive integer is `400 bad_request`.
    #[param(value_type = u32, minimum = 1)]
    pub version: String,
}

/// The query of an upload: only `activate=true` or `activate=false` (anything else is `400
/// bad_request`).
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UploadQuery {
    /// `true`: make the new version active at once (calls that start from then on get it; live calls
    /// finish on the version they started with). `false` or absent: store it only.
    #[allow(dead_code)]
    activate: Option<bool>,
}

/// An upload's body: the component's `.wasm` file, byte for byte.
#[derive(ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct WasmFile(#[allow(dead_code)] Vec<u8>);

// The answers below are types only for their derive, which reads the field's type (so the field is never
// read) and takes the doc comment as the answer's description.

/// `unauthorized`: the `Authorization: Bearer` token is missing or unknown.
#[derive(ToResponse)]
#[response(example = json!({"error": {"code": "unauthorized",
    "message": "send a tenant's admin token as `Authorization: Bearer <token>`"}}))]
pub struct Unauthorized(#[allow(dead_code)] ErrorBody);

/// `not_found`: the tenant has no such agent (or no such version of it), or there is no such route. An
/// agent of another tenant is not found too.
#[derive(ToResponse)]
#[response(example = json!({"error": {"code": "not_found", "message": "no agent \"agent_abc123\""}}))]
pub struct NotFound(#[allow(dead_code)] ErrorBody);

/// `bad_request`: a version in the path that is not a positive integer, or a body that is not the JSON
/// this operation expects (unknown fields included).
#[derive(ToResponse)]
#[response(examples(
    ("version" = (summary = "A version that is not a number",
        value = json!({"error": {"code": "bad_request", "message": "\"two\" is not a version number"}}))),
    ("body" = (summary = "A body that is not the JSON expected",
        value = json!({"error": {"code": "bad_request",
            "message": "the body: missing field `version` at line 1 column 2"}}))),
))]
pub struct BadRequest(#[allow(dead_code)] ErrorBody);

/// The upload was refused and nothing was stored: `bad_request` (a malformed agent id, or a query other
/// than `activate=true|false`), `not_wasm` (an empty body too), `core_module` or `invalid_component`
/// (400); `too_large` (413); `wrong_world` or `over_limits` (422, also a compile over the host's bounds);
/// `timeout` (408: the body took longer than the host waits); `busy` (429, with `Retry-After`: the tenant
/// has as many uploads in progress as it may, or its compiles used its compile time per hour).
#[derive(ToResponse)]
#[response(examples(
    ("not_wasm" = (summary = "The body is not WebAssembly", value = json!({"error": {"code": "not_wasm",
        "message": "the body is not WebAssembly (it does not start with \\0asm)"}}))),
    ("core_module" = (summary = "A core module, not a component", value = json!({"error": {
        "code": "core_module",
        "message": "this is a core WebAssembly module, not a component: build for wasm32-wasip2"}}))),
    ("wrong_world" = (summary = "A component for another world", value = json!({"error": {
        "code": "wrong_world",
        "message": "the component imports wasi:filesystem/types@0.2.0, which agents do not get"}}))),
    ("too_large" = (summary = "Over the tenant's cap", value = json!({"error": {"code": "too_large",
        "message": "the component is over this tenant's cap of 41943040 bytes"}}))),
    ("over_limits" = (summary = "Needs more memory than the agent may have", value = json!({"error": {
        "code": "over_limits",
        "message": "the component's initial memory is 100.0 MiB, over the agent's memory_mib = 64"}}))),
    ("compile_over_limits" = (summary = "Costs more to compile than the host allows", value = json!({
        "error": {"code": "over_limits",
        "message": "the component costs too much to compile: compiling it took over 120 s of CPU"}}))),
    ("timeout" = (summary = "The body was too slow", value = json!({"error": {"code": "timeout",
        "message": "the body did not arrive within 120 s: nothing was kept"}}))),
    ("busy" = (summary = "Too many uploads in progress", value = json!({"error": {"code": "busy",
        "message": "this tenant has 2 uploads in progress, as many as it may: try again once one has been answered"}}))),
    ("compile_time" = (summary = "The tenant's compile time is spent", value = json!({"error": {"code": "busy",
        "message": "this tenant's compiles (refused ones too) have used the 900 s of compile time it gets per hour: try again in 41 s"}}))),
    ("over_quota" = (summary = "Over the tenant's quota", value = json!({"error": {"code": "over_quota",
        "message": "the tenant would keep 101 of versions, over its quota (quota.versions = 100): delete versions it no longer needs, or ask the operator for more"}}))),
))]
pub struct UploadRejected(#[allow(dead_code)] ErrorBody);

/// `over_limits`: the version could never start under the agent's limits as they are now (its initial
/// memory is over `memory_mib`); nothing changed.
#[derive(ToResponse)]
#[response(examples(
    ("over_limits" = (summary = "Needs more memory than the agent may have", value = json!({"error": {
        "code": "over_limits",
        "message": "the component's initial memory is 100.0 MiB, over the agent's memory_mib = 64"}}))),
))]
pub struct OverLimits(#[allow(dead_code)] ErrorBody);

/// `conflict`: the request clashes with the agent's state: deleting its active version, or rolling back
/// with no earlier active version to go back to.
#[derive(ToResponse)]
#[response(examples(
    ("active" = (summary = "Deleting the active version", value = json!({"error": {"code": "conflict",
        "message": "version 2 is active: activate another one, or delete the agent"}}))),
    ("rollback" = (summary = "Nothing to roll back to", value = json!({"error": {"code": "conflict",
        "message": "agent \"agent_abc123\" has no earlier active version to roll back to"}}))),
))]
pub struct Conflict(#[allow(dead_code)] ErrorBody);

/// `internal`: the host failed (e.g. its component store). The message says no more; the operator's log
/// has the details.
#[derive(ToResponse)]
#[response(example = json!({"error": {"code": "internal", "message": "the host failed; its log says why"}}))]
pub struct Internal(#[allow(dead_code)] ErrorBody);
