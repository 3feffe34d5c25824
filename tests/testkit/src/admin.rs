//! One HTTP/1.1 request to the admin API, for the tests and the restart bench: the raw status and body, so
//! error answers can be checked too.

use anyhow::{anyhow, Result};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::time::Duration;

/// How long an answer may take (an upload of a large component compiles first).
const PATIENCE: Duration = Duration::from_secs(180);

/// A request on a fresh loopback connection: the status and the body (JSON when it is, else a string).
pub async fn send(
    base: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> Result<(u16, Value)> {
    let authority = authority(base)?;
    let stream = tokio::net::TcpStream::connect(authority).await?;
    exchange(stream, authority, method, path, token, body).await
}

/// [`send`] from the loopback address `source` (127.0.0.0/8) to an IPv4 `base`: another client, as the
/// admin listener's per-address limits see it.
pub async fn send_from(
    source: [u8; 4],
    base: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> Result<(u16, Value)> {
    let authority = authority(base)?;
    let socket = tokio::net::TcpSocket::new_v4()?;
    // Many short connections from one address: its ports in TIME_WAIT may be bound again.
    socket.set_reuseaddr(true)?;
    socket.bind((source, 0).into())?;
    let stream = socket.connect(authority.parse()?).await?;
    exchange(stream, authority, method, path, token, body).await
}

/// `base` without its `http://`.
fn authority(base: &str) -> Result<&str> {
    base.strip_prefix("http://")
        .ok_or_else(|| anyhow!("not an http:// address: {base}"))
}

/// One request and its answer on `stream`.
async fn exchange(
    stream: tokio::net::TcpStream,
    authority: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> Result<(u16, Value)> {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let mut builder = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", authority);
    if let Some(token) = token {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    let response = tokio::time::timeout(
        PATIENCE,
        sender.send_request(builder.body(Full::new(Bytes::from(body)))?),
    )
    .await
    .map_err(|_| anyhow!("{method} {path}: no answer"))??;
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await?.to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Ok((status, value))
}
