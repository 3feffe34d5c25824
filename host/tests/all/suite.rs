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

/// Every rule tag in the core's and the host's source (`[scenario: a, b]`, beside the code that keeps the rule) names a
/// scenario that exists, so a renamed or removed scenario cannot leave a rule pointing at nothing.
#[test]
fn every_rule_tag_names_a_scenario() {
    let known: Vec<&str> = sentsim::scenarios::SCENARIOS
        .iter()
        .chain(sentsim::pressure::SCENARIOS)
        .map(|s| s.name)
        .collect();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("proto/src"), root.join("host/src")];
    let mut tags = 0;
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        // A tag may run over two comment lines: join them first.
        let joined = text.replace("\n", " ").replace("///", "").replace("//", "");
        for tag in joined.split("[scenario: ").skip(1) {
            let names = tag.split(']').next().unwrap();
            for name in names.split(',').map(str::trim) {
                assert!(
                    known.contains(&name),
                    "{}: [scenario: {name}] names no scenario",
                    path.display()
                );
                tags += 1;
            }
        }
    }
    assert!(tags > 20, "only {tags} rule tags found");
}
