//! The pressure scenarios (sentsim's `pressure::SCENARIOS`: Sent under timing pressure and at its limits)
//! against voicehost, one test each, named after its scenario, each on a host of its own started as the
//! scenario needs (its guest, tool timeout, failure policy) on a simulator from `pressure::sim_config`.

use sentsim::pressure::{self, SCENARIOS};
use sentsim::scenarios::{AgentKind, Needs, Scenario};
use sentsim::suite::{self, Ctx, Profile};
use std::time::Duration;
use voicehost::agent::{CallRules, FailurePolicy};
use voicehost_testkit::{guest, Host};

fn scenario(name: &str) -> &'static Scenario {
    SCENARIOS
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no pressure scenario {name}"))
}

/// A host started as `needs` says.
async fn host_for(needs: &Needs) -> Host {
    let wasm = guest(match needs.agent {
        AgentKind::Conformance | AgentKind::VoicehostConformance => "conformance",
        AgentKind::Prober => "prober",
    });
    let mut rules = CallRules::default();
    if let Some(ms) = needs.host.tool_timeout_ms {
        rules.call.tool_timeout = Duration::from_millis(ms);
    }
    if let Some((kind, value)) = needs.host.transfer_to {
        // A host that refuses the party where the policy is made keeps hanging up: the scenario then
        // sees the hangup it wants.
        rules.policy = FailurePolicy::transfer(kind, value).unwrap_or_else(|error| {
            println!("the failure policy transfer:{kind}:{value} is refused ({error}): hanging up");
            FailurePolicy::HangUp
        });
    }
    Host::serve_with(
        &wasm,
        rules,
        needs.host.connections,
        pressure::sim_config(needs),
    )
    .await
}

/// Runs the scenario `name` on a host of its own and fails the test unless it passed (no error, no
/// protocol violation); returns the host, still serving, for checks of its own.
async fn run(name: &str) -> Host {
    let scenario = scenario(name);
    let host = host_for(&scenario.needs).await;
    let ctx = Ctx {
        sim: host.sim.clone(),
        profile: Profile {
            concurrent_audio: true,
        },
        poke: None,
    };
    let outcome = suite::run_one(&ctx, scenario).await;
    println!("{name}: {}\n{}", outcome.passed, host.stats);
    if !outcome.passed && std::env::var_os("PRESSURE_TRANSCRIPT").is_some() {
        // Every record, for a failure that needs more than its message.
        for record in host.sim.recorder().since(0, |_| true) {
            println!("{} ms {record}", host.sim.recorder().elapsed_ms(&record));
        }
    }
    assert!(outcome.passed, "{name}: {}", outcome.detail);
    host
}

/// One test per scenario, and a check that the list here is the whole list.
macro_rules! pressure_tests {
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {
        $(
            $(#[$attr])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                run(stringify!($name)).await.finish().await;
            }
        )*

        #[test]
        fn every_pressure_scenario_has_a_test_here() {
            let mut here = vec![$(stringify!($name)),*];
            here.push("unreachable_sent_loses_call_after_window");
            let mut all: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
            here.sort_unstable();
            all.sort_unstable();
            assert_eq!(here, all);
        }
    };
}

pressure_tests!(
    starts_behind_ready_not_dropped,
    close_right_after_ready_keeps_dialling,
    flapping_connection_backs_off,
    duplicate_session_start_ignored,
    wrong_direction_frames_not_counted,
    huge_received_does_not_wrap,
    unknown_tool_result_ignored,
    repeated_tool_result_reaches_nobody,
    refused_tool_call_answered,
    timed_out_tools_leave_nothing_behind,
    failed_policy_transfer_hangs_up,
    audio_of_an_ended_call_not_written,
    resumed_without_stream_sends_no_audio,
    extra_connections_retired,
    oversized_message_closes_the_connection,
    overlong_session_id_dropped,
    unread_frames_refused_over_limit,
    flooded_call_gets_failure_policy,
    oversized_audio_is_cut,
    audio_flood_bounded,
    speech_during_a_resume_is_held,
    slow_reader_hears_all_speech,
    frames_lost_unwritten_stay_replayable,
    full_resume_keeps_the_drained_call,
    unsendable_policy_transfer_hangs_up,
    late_resumed_is_not_left_silent,
    resumed_on_a_draining_connection_moves_on,
    given_up_guest_stays_silent,
);

/// The scenario, and what the host counted: the call was lost once, and nothing is left live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_sent_loses_call_after_window() {
    let host = run("unreachable_sent_loses_call_after_window").await;
    assert_eq!(host.stats.sessions_lost.get(), 1, "{}", host.stats);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while host.stats.live_count() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} call(s) still live after the scenario",
            host.stats.live_count()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    host.finish().await;
}
