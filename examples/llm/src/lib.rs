//! An agent that asks a language model over HTTP (`wasi:http`) what to say.
//!
//! * session start: says "Hello from the llm agent." (text calls);
//! * each `user.said`: POSTs `{"text": "<what the user said>"}` as JSON to the URL in the call's context
//!   (`call.context`, key `llm_url`), reads the JSON answer `{"reply": "..."}` and says the reply;
//! * when the request fails (refused by the host's allowlist, timed out, an answer too large, not the JSON
//!   it expects): says "sorry, I cannot reach my brain (<why>)", where `<why>` is the `wasi:http` error
//!   code's name (`HttpRequestDenied`, `ConnectionReadTimeout`, `HttpResponseBodySize`, ...) or what else
//!   went wrong;
//! * with no `llm_url` in the context: says "sorry, I have no brain configured".
//!
//! The host decides where an agent may send requests: by default nowhere.

use voicehost_agent::serde_json::{self, json, Value};
use voicehost_agent::{export_agent, log, Agent, Error, Media, Session, UserSaid};
use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, IncomingBody, Method, OutgoingBody, OutgoingRequest, Scheme,
};
use wasip2::io::streams::StreamError;

/// The largest answer the agent reads, whatever the host allows.
const MAX_ANSWER: usize = 1 << 20;

/// The llm agent: no state of its own.
#[derive(Default)]
pub struct Llm;

impl Agent for Llm {
    fn on_session_start(&self, session: &Session) -> Result<(), Error> {
        if session.info().media == Media::Text {
            session.say("Hello from the llm agent.")?;
        }
        Ok(())
    }

    fn on_user_said(&self, session: &Session, said: UserSaid) -> Result<(), Error> {
        let Some(url) = llm_url(session) else {
            session.say("sorry, I have no brain configured")?;
            return Ok(());
        };
        match ask(&url, &said.text) {
            Ok(reply) => session.say_with(&reply, None, None)?,
            Err(why) => {
                log::warn!("the model could not answer: {why}");
                session.say(&format!("sorry, I cannot reach my brain ({why})"))?;
            }
        }
        Ok(())
    }
}

/// `llm_url` in the call's context (a JSON object, as text).
fn llm_url(session: &Session) -> Option<String> {
    let context: Value = serde_json::from_str(&session.info().context?).ok()?;
    Some(context.get("llm_url")?.as_str()?.to_string())
}

/// The model's reply to `text`, or why there is none.
fn ask(url: &str, text: &str) -> Result<String, String> {
    let body = serde_json::to_vec(&json!({ "text": text })).map_err(|e| e.to_string())?;
    let (status, answer) = post_json(url, &body)?;
    if !(200..300).contains(&status) {
        return Err(format!("HTTP status {status}"));
    }
    let answer: Value =
        serde_json::from_slice(&answer).map_err(|_| "an answer that is not JSON".to_string())?;
    answer
        .get("reply")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| "an answer with no reply".to_string())
}

/// The name of a `wasi:http` error code: `HttpRequestDenied` for `ErrorCode::HttpRequestDenied`.
fn code_name(code: &ErrorCode) -> String {
    let debug = format!("{code:?}");
    let name = debug.strip_prefix("ErrorCode::").unwrap_or(&debug);
    name.split('(').next().unwrap_or(name).to_string()
}

/// The parts of `scheme://authority/path?query`.
fn split_url(url: &str) -> Result<(Scheme, &str, &str), String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "a URL without a scheme".to_string())?;
    let scheme = match scheme {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        _ => return Err(format!("a URL with the scheme {scheme:?}")),
    };
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    Ok((scheme, authority, if path.is_empty() { "/" } else { path }))
}

/// POSTs `body` as JSON to `url`, blocking until the whole answer is in: its status and body.
fn post_json(url: &str, body: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let (scheme, authority, path) = split_url(url)?;
    let headers = Fields::from_list(&[
        ("content-type".to_string(), b"application/json".to_vec()),
        (
            "content-length".to_string(),
            body.len().to_string().into_bytes(),
        ),
    ])
    .map_err(|e| format!("headers: {e:?}"))?;
    let request = OutgoingRequest::new(headers);
    let invalid = |what: &str| format!("an invalid {what}");
    request
        .set_method(&Method::Post)
        .map_err(|()| invalid("method"))?;
    request
        .set_scheme(Some(&scheme))
        .map_err(|()| invalid("scheme"))?;
    request
        .set_authority(Some(authority))
        .map_err(|()| invalid("authority"))?;
    request
        .set_path_with_query(Some(path))
        .map_err(|()| invalid("path"))?;
    let outgoing = request.body().map_err(|()| "no request body".to_string())?;

    // The host decides here whether the request may go out at all; its answer comes with the response.
    let pending = outgoing_handler::handle(request, None).map_err(|code| code_name(&code))?;

    {
        let stream = outgoing
            .write()
            .map_err(|()| "no request body stream".to_string())?;
        // At most 4096 bytes per blocking write.
        for chunk in body.chunks(4096) {
            if let Err(error) = stream.blocking_write_and_flush(chunk) {
                // The request failed: the response says why.
                log::debug(&format!("writing the request body: {error:?}"));
                break;
            }
        }
    }
    // A body that could not be finished leaves the reason to the response, too.
    let _ = OutgoingBody::finish(outgoing, None);

    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(code))) => return Err(code_name(&code)),
        Some(Err(())) | None => return Err("no response".to_string()),
    };
    let status = response.status();
    let incoming = response
        .consume()
        .map_err(|()| "no response body".to_string())?;
    let answer = read_all(&incoming)?;
    drop(incoming);
    drop(response);
    Ok((status, answer))
}

/// The whole body, up to [`MAX_ANSWER`] bytes.
fn read_all(incoming: &IncomingBody) -> Result<Vec<u8>, String> {
    let stream = incoming
        .stream()
        .map_err(|()| "no response body stream".to_string())?;
    let mut answer = Vec::new();
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) => {
                answer.extend_from_slice(&chunk);
                if answer.len() > MAX_ANSWER {
                    return Err("an answer too large".to_string());
                }
            }
            Err(StreamError::Closed) => return Ok(answer),
            Err(StreamError::LastOperationFailed(error)) => {
                return Err(match wasip2::http::types::http_error_code(&error) {
                    Some(code) => code_name(&code),
                    None => error.to_debug_string(),
                })
            }
        }
    }
}

export_agent!(Llm);
