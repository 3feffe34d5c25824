//! The simulator's whole scenario suite against voicehost serving the Rust conformance component, with no
//! expected deviation: the scenarios the official SDK only passes for lack of a window (connection_full,
//! after the end) must pass here too.

use sentsim::suite::{self, Ctx, Profile};
use voicehost::agent::CallRules;
use voicehost::agent::ConnectError;
use voicehost_testkit::Host;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voicehost_passes_every_scenario_with_the_rust_conformance_agent() {
    let host = Host::start("conformance", CallRules::default()).await;
    let ctx = Ctx {
        sim: host.sim.clone(),
        profile: Profile {
            concurrent_audio: true,
        },
        poke: None,
    };
    let filter = std::env::var("SENTSIM_FILTER").unwrap_or_default();
    let report = suite::run(&ctx, &filter).await;
    println!("{report}\n{}", host.stats);
    assert_eq!(report.failed(), 0, "\n{report}");
    if filter.is_empty() {
        // The last scenario refuses the host with 401: it stops with that refusal.
        let refused = host.stopped().await;
        assert!(
            matches!(refused, Err(ConnectError::Refused { status: 401, .. })),
            "{refused:?}"
        );
    } else {
        host.finish().await;
    }
}
