//! The guests' CPU is shared fairly (issue 24): a call whose guest burns CPU is the one slowed, never its
//! neighbours. Guests run on a runtime of their own beside the host's I/O, and yield their worker and
//! their core at every epoch tick (`voicehost::sandbox`'s `cpu.rs`).

use std::time::{Duration, Instant};
use voicehost::agent::CallRules;
use voicehost_testkit::{
    audio_frame as frame, echo_latencies, guest, paced_frames, prober_call, quantile, Host,
};

/// The bound the neighbour's echo stays within, at its 99th percentile. Alone it is about a millisecond
/// on the 2-core machine the suite runs on, beside the four burners a few (`BENCHMARKS.md`); before the
/// guests had a runtime of their own it was seconds. Generous, for a loaded machine: seen in this debug
/// build, 30 ms beside the rest of the suite, 107–114 ms with two CPU-bound processes beside it.
const NEIGHBOUR_P99_BOUND: Duration = Duration::from_millis(200);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_neighbours_echo_stays_prompt_beside_four_calls_burning_more_cpu_than_the_host_has() {
    let host = Host::serve_with(
        &guest("prober"),
        CallRules::default(),
        1,
        Default::default(),
    )
    .await;
    let conn = host.connection().await;
    // Each burns 150 ms of CPU for every 20 ms frame, under its deadline: 30 cores' worth in all.
    let burners: Vec<_> = (0..4).map(|_| prober_call(&conn, "spin 150")).collect();
    let mut neighbour = conn.start_audio(16_000);
    let warm = frame(9_999);
    neighbour.send_audio(&warm);
    neighbour.expect_audio(&warm).await.unwrap();

    let recorder = host.sim.recorder();
    let from = recorder.len();
    const FRAMES: usize = 150;
    paced_frames(&neighbour, &burners, FRAMES).await;
    // Every echo back, or 5 s after the last frame.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut latencies = loop {
        let latencies = echo_latencies(recorder, from, &neighbour.id);
        if latencies.len() == FRAMES || Instant::now() > deadline {
            break latencies;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(latencies.len(), FRAMES, "echoes lost beside the burners");
    latencies.sort();
    let p99 = quantile(&latencies, 0.99);
    println!(
        "neighbour beside 4 burners: p50 {:?}, p99 {p99:?}",
        quantile(&latencies, 0.5)
    );
    assert!(
        p99 <= NEIGHBOUR_P99_BOUND,
        "the neighbour's echo p99 is {p99:?}, over {NEIGHBOUR_P99_BOUND:?}"
    );
    // No burner was stopped: however slowly it was served, waiting is not charged to its CPU deadline.
    assert_eq!(host.stats.traps(), 0, "{}", host.stats);
    host.finish().await;
}
