//! The admin API in TLS, with the real `voicehost` binary: served with the config's certificate, spoken to
//! by `voicehost agents` over `https://`, never in clear on the same port, and given a new certificate by
//! SIGHUP (a broken one is refused and the old one kept).

use crate::operator::{one_tenant, Served, BIN};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Writes a new self-signed certificate for `localhost` and its key into `dir` (cert.pem, key.pem), and a
/// copy of the certificate as `name` for clients to trust.
fn new_certificate(dir: &Path, name: &str) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    std::fs::write(dir.join(name), made.cert.pem()).unwrap();
    std::fs::write(dir.join("cert.pem"), made.cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), made.signing_key.serialize_pem()).unwrap();
}

/// `voicehost agents list --json` against `admin`, trusting `ca` if given.
fn list(admin: &str, token: &str, ca: Option<&Path>) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(["agents", "list", "--json", "--timeout", "10"])
        .env("VOICEHOST_ADMIN", admin)
        .env("VOICEHOST_TOKEN", token)
        .env_remove("VOICEHOST_CA_FILE");
    if let Some(ca) = ca {
        command.arg("--ca-file").arg(ca);
    }
    command.output().unwrap()
}

fn said(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_serves_tls_with_its_certificate_and_takes_a_new_one_on_sighup() {
    let token = "vh_tls_test_token_0123456789";
    let (dir, config) = one_tenant("admin-tls", token);
    new_certificate(&dir, "first.pem");
    // Relative to the config's directory; a short head deadline for the stalled client below.
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "listen = \"127.0.0.1:0\"\n",
        "listen = \"127.0.0.1:0\"\ntls_cert = \"cert.pem\"\ntls_key = \"key.pem\"\nhead_timeout_seconds = 1\n",
    );
    std::fs::write(&config, text).unwrap();
    let served = Served::start(&config);
    let address = served.admin.trim_start_matches("http://").to_string();
    let port = address.rsplit(':').next().unwrap();
    let https = format!("https://localhost:{port}");

    // The CLI over TLS, trusting the host's certificate; without it, the web's roots refuse it.
    let trusted = list(&https, token, Some(&dir.join("first.pem")));
    assert!(trusted.status.success(), "{}", said(&trusted));
    assert!(said(&trusted).contains("\"agents\""), "{}", said(&trusted));
    let untrusted = list(&https, token, None);
    assert!(!untrusted.status.success());
    assert!(said(&untrusted).contains("TLS"), "{}", said(&untrusted));

    // Plain HTTP on the same port gets no HTTP answer, and the token it sent goes nowhere.
    let mut plain = tokio::net::TcpStream::connect(&address).await.unwrap();
    plain
        .write_all(
            format!("GET /v1/agents HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut answer)).await;
    assert!(
        !answer.starts_with(b"HTTP/"),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // A client that opens a connection and never says hello is closed at the head deadline: the config's
    // 1 s, not before (nothing else closes it) and not at the default's 10 s.
    let mut stalled = tokio::net::TcpStream::connect(&address).await.unwrap();
    let started = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(10), stalled.read(&mut [0; 16])).await;
    let waited = started.elapsed();
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "closed after {waited:?}, with a head deadline of 1 s"
    );

    // A new certificate, then SIGHUP: the next connection gets it.
    new_certificate(&dir, "second.pem");
    served.signal("HUP");
    served.wait_for_log("the admin API's certificate is reloaded");
    let old = list(&https, token, Some(&dir.join("first.pem")));
    assert!(!old.status.success(), "{}", said(&old));
    let new = list(&https, token, Some(&dir.join("second.pem")));
    assert!(new.status.success(), "{}", said(&new));

    // A key that does not load is refused on SIGHUP, and the certificate served stays.
    std::fs::write(dir.join("key.pem"), "not a key").unwrap();
    served.signal("HUP");
    served.wait_for_log("the admin API's certificate was not reloaded");
    let kept = list(&https, token, Some(&dir.join("second.pem")));
    assert!(kept.status.success(), "{}", said(&kept));

    let log = served.stop();
    assert!(log.contains("admin API listening: HTTPS"), "{log}");
    assert!(!log.contains(token), "the log holds the admin token");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_tls_handshake_rate_are_closed_at_once() {
    let token = "vh_tls_rate_token_0123456789";
    let (dir, config) = one_tenant("admin-tls-rate", token);
    new_certificate(&dir, "cert-copy.pem");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "listen = \"127.0.0.1:0\"\n",
        "listen = \"127.0.0.1:0\"\ntls_cert = \"cert.pem\"\ntls_key = \"key.pem\"\n\
         tls_handshakes_per_second = 1\nhead_timeout_seconds = 5\n",
    );
    std::fs::write(&config, text).unwrap();
    let served = Served::start(&config);
    let address = served.admin.trim_start_matches("http://").to_string();

    // Twenty connections at once: one may begin its handshake (it waits for a hello), the others are
    // closed before any. One handshake a second: on a slow machine, one more for each second the
    // connecting took, and the test says so if that leaves nothing to check.
    const AT_ONCE: usize = 20;
    let mut connections = Vec::new();
    let started = Instant::now();
    for _ in 0..AT_ONCE {
        connections.push(tokio::net::TcpStream::connect(&address).await.unwrap());
    }
    let admitted = 1 + started.elapsed().as_secs() as usize;
    assert!(
        admitted < AT_ONCE / 2,
        "connecting {AT_ONCE} took {:?}: too slow to tell a rate of 1/s",
        started.elapsed()
    );
    let mut closed = 0;
    for connection in &mut connections {
        let read =
            tokio::time::timeout(Duration::from_secs(1), connection.read(&mut [0; 16])).await;
        if matches!(read, Ok(Ok(0)) | Ok(Err(_))) {
            closed += 1;
        }
    }
    assert!(
        closed >= AT_ONCE - admitted,
        "{closed} of {AT_ONCE} closed at once, {admitted} admitted"
    );
    assert!(closed < AT_ONCE, "even the first connection was closed");
    served.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A connection to `address` from `ip` (a loopback address of its own).
async fn connect_from(address: &str, ip: [u8; 4]) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind((ip, 0).into()).unwrap();
    socket.connect(address.parse().unwrap()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_connecting_again_and_again_takes_only_its_share_of_tls_handshakes() {
    let token = "vh_tls_share_token_0123456789";
    let (dir, config) = one_tenant("admin-tls-share", token);
    new_certificate(&dir, "cert-copy.pem");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "listen = \"127.0.0.1:0\"\n",
        "listen = \"127.0.0.1:0\"\ntls_cert = \"cert.pem\"\ntls_key = \"key.pem\"\n\
         tls_handshakes_per_second = 20\nhead_timeout_seconds = 5\n",
    );
    std::fs::write(&config, text).unwrap();
    let served = Served::start(&config);
    let address = served.admin.trim_start_matches("http://").to_string();

    // 127.0.0.5 opens 20 connections at once: its share is 2 a second, so most are closed at once.
    const AT_ONCE: usize = 20;
    let started = Instant::now();
    let mut flood = Vec::new();
    for _ in 0..AT_ONCE {
        flood.push(connect_from(&address, [127, 0, 0, 5]).await);
    }
    let admitted = 2 * (1 + started.elapsed().as_secs() as usize);
    assert!(
        admitted < AT_ONCE / 2,
        "connecting {AT_ONCE} took {:?}: too slow to tell a rate of 2/s",
        started.elapsed()
    );
    let mut closed = 0;
    for connection in &mut flood {
        let read =
            tokio::time::timeout(Duration::from_millis(500), connection.read(&mut [0; 16])).await;
        if matches!(read, Ok(Ok(0)) | Ok(Err(_))) {
            closed += 1;
        }
    }
    assert!(
        closed >= AT_ONCE - admitted,
        "{closed} of {AT_ONCE} closed at once, {admitted} admitted"
    );
    // Another address still begins its handshake: the listener waits for its hello.
    let mut other = connect_from(&address, [127, 0, 0, 6]).await;
    let read = tokio::time::timeout(Duration::from_secs(1), other.read(&mut [0; 16])).await;
    assert!(read.is_err(), "the other address was refused: {read:?}");
    served.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
