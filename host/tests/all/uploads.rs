//! Uploads with the real `voicehost` binary: a body is received into a file under `data/uploads`, never
//! held in memory, and an upload its client abandons leaves nothing, in memory or on disk.

use crate::operator::{one_tenant, Served};
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt as _;

/// The resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

/// The sizes of the files in `dir`.
fn sizes(dir: &Path) -> Vec<u64> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (at most 30 s) until `done` holds of the files in `dir`.
async fn until(dir: &Path, what: &str, done: impl Fn(&[u64]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done(&sizes(dir)) {
        assert!(Instant::now() < deadline, "{what}: {:?}", sizes(dir));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_in_progress_are_held_on_disk_not_in_memory_and_abandoned_ones_leave_nothing() {
    const SENT: usize = 32 << 20;
    let token = "vh_uploads_test_token_0123456789";
    let (dir, config) = one_tenant("uploads-abandoned", token);
    let served = Served::start(&config);
    served.healthy().await;
    let pid = served.child.id();
    let before = rss(pid);

    // Two uploads (as many as a tenant may have at once) of 32 MiB each, their last bytes never sent.
    let address = served.admin.trim_start_matches("http://").to_string();
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
        let head = format!(
            "POST /v1/agents/agent_x/versions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/wasm\r\nContent-Length: {}\r\n\r\n",
            SENT + 1
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut body = b"\0asm\x0d\0\x01\0".to_vec();
        body.resize(SENT, 0x5a);
        stream.write_all(&body).await.unwrap();
        held.push(stream);
    }
    let uploads = dir.join("data").join("uploads");
    // (All but what the file's write buffer, 64 KiB, holds.)
    until(&uploads, "both bodies written to disk", |sizes| {
        sizes.len() == 2 && sizes.iter().all(|&n| n + (64 << 10) >= SENT as u64)
    })
    .await;
    // 64 MiB received; the host's memory grew by far less than one body.
    let during = rss(pid);
    assert!(
        during < before + (SENT as u64) / 2,
        "resident memory {} MiB → {} MiB with 64 MiB of uploads in progress",
        before >> 20,
        during >> 20
    );

    // The clients go away: their files go, and nothing was stored.
    drop(held);
    until(&uploads, "the abandoned uploads' files removed", |sizes| {
        sizes.is_empty()
    })
    .await;
    assert!(sizes(&dir.join("data").join("components")).is_empty());
    let after = rss(pid);
    eprintln!(
        "resident memory: {} MiB before, {} MiB with 64 MiB of uploads in progress, {} MiB after",
        before >> 20,
        during >> 20,
        after >> 20
    );
    assert!(
        after < before + (SENT as u64) / 2,
        "resident memory {} MiB → {} MiB after the uploads were abandoned",
        before >> 20,
        after >> 20
    );
    served.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
