//! Guest faults, end to end: the example agents panic, spin, hog memory and recurse on command, and the host
//! contains each trap in the call it happened on, gives that call a fresh instance (which reads back what
//! was saved), applies the failure policy when the traps keep coming, and breaks no protocol rule meanwhile.
//! Everything runs on loopback against the Sent simulator.

use crate::containment::ask_until;
use sentsim::Call;
use std::time::{Duration, Instant};
use voicehost::agent::{CallRules, FailurePolicy};
use voicehost::sandbox::wit::UserSaid;
use voicehost::sandbox::{Event, Instance, Limits, Outcome, TrapKind};
use voicehost_testkit::{guest, sandbox, Host, Quiet};

/// 20 ms of 16-bit mono audio at 16000 Hz.
const FRAME_BYTES: usize = 640;

/// Audio frame `n`: 320 samples no other frame has.
fn audio_frame(n: usize) -> Vec<u8> {
    (0..FRAME_BYTES / 2)
        .flat_map(|i| ((n * 1000 + i) as i16).to_le_bytes())
        .collect()
}

/// Waits until Sent knows the session ended, and returns the reason.
async fn ended(call: &Call) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(reason) = call.state().and_then(|s| s.ended) {
            return reason;
        }
        assert!(
            Instant::now() < deadline,
            "session {} did not end: {:?}",
            call.id,
            call.state()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_on_one_session_leaves_the_audio_of_another_on_the_same_connection_uninterrupted() {
    let host = Host::start("panicker", CallRules::default()).await;
    let conn = host.connection().await;
    let mut audio = conn.start_audio(16000);
    let mut text = conn.start_text();
    text.expect_say("Hello from the panicker.").await.unwrap();

    let mut pace = tokio::time::interval(Duration::from_millis(20));
    for n in 0..50 {
        pace.tick().await;
        audio.send_audio(&audio_frame(n));
        if n == 25 {
            text.say("panic");
        }
        if n == 35 {
            // The trap happens while the audio is flowing, not after it.
            let deadline = Instant::now() + Duration::from_secs(2);
            while host.stats.traps() == 0 {
                assert!(Instant::now() < deadline, "no trap: {}", host.stats);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    for n in 0..50 {
        audio
            .expect_audio(&audio_frame(n))
            .await
            .unwrap_or_else(|e| panic!("echo of frame {n}: {e:#}"));
    }
    text.say("echo after");
    text.expect_say("after").await.unwrap();
    audio
        .expect_nothing(Duration::from_millis(100))
        .await
        .unwrap();

    let stats = &host.stats;
    assert_eq!(stats.traps(), 1, "{stats}");
    assert_eq!(stats.trapped(TrapKind::Panic), 1, "{stats}");
    assert_eq!(stats.restarts.get(), 1, "{stats}");
    assert_eq!(stats.audio_dropped.get(), 0, "{stats}");
    assert_eq!(stats.audio_out.get(), 50, "{stats}");
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_loop_is_interrupted_at_its_cpu_deadline_and_the_session_goes_on() {
    let rules = CallRules {
        limits: Limits {
            cpu_per_call: Duration::from_millis(100),
            ..Limits::default()
        },
        ..CallRules::default()
    };
    let host = Host::start("looper", rules).await;
    let conn = host.connection().await;
    let mut call = conn.start_text();
    call.expect_say("Hello from the looper.").await.unwrap();

    let started = Instant::now();
    call.say("loop");
    call.say("echo alive");
    call.expect_say("alive").await.unwrap();
    // 100 ms of guest time, far from the 60 s wall-clock bound; the margin is for a loaded machine.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "the loop ran for {took:?}");

    let stats = &host.stats;
    assert_eq!(stats.traps(), 1, "{stats}");
    assert_eq!(stats.trapped(TrapKind::CpuDeadline), 1, "{stats}");
    assert_eq!(stats.restarts.get(), 1, "{stats}");
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_loop_through_each_import_is_interrupted_at_its_cpu_deadline_not_its_wall_bound()
{
    let imports = [
        "say",
        "info",
        "load",
        "save",
        "log",
        "send-audio",
        "clock",
        "random",
    ];
    let rules = CallRules {
        limits: Limits {
            cpu_per_call: Duration::from_millis(100),
            ..Limits::default()
        },
        // One trap per import, all on one call: no failure policy in between.
        max_traps: imports.len() + 1,
        ..CallRules::default()
    };
    let host = Host::start("looper", rules).await;
    let conn = host.connection().await;
    let mut call = conn.start_text();
    call.expect_say("Hello from the looper.").await.unwrap();

    for (n, import) in imports.iter().enumerate() {
        call.say(&format!("loop-through {import}"));
        // Time in the host's side of each call counts too: the CPU deadline stops it, not the 60 s bound.
        let traps = n as u64 + 1;
        until_stats(&host, import, |s| s.traps() == traps).await;
        let stats = &host.stats;
        assert_eq!(
            stats.trapped(TrapKind::CpuDeadline),
            traps,
            "{import}: {stats}"
        );
        // The call goes on. (Right after a `say` loop the call's queue may still be full, and a `say` is
        // refused `over-limit` until Sent has read it: ask again until the answer comes.)
        let ask = format!("echo after {import}");
        call.say(&ask);
        ask_until(&mut call, &ask, |text| text == &ask["echo ".len()..]).await;
    }
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_hog_is_refused_at_its_cap_and_the_session_goes_on() {
    let rules = CallRules {
        limits: Limits {
            memory_bytes: 16 << 20,
            ..Limits::default()
        },
        ..CallRules::default()
    };
    let host = Host::start("hog", rules).await;
    let conn = host.connection().await;
    let mut call = conn.start_text();
    call.expect_say("Hello from the hog.").await.unwrap();

    call.say("grow");
    call.say("echo alive");
    call.expect_say("alive").await.unwrap();

    let stats = &host.stats;
    assert_eq!(stats.traps(), 1, "{stats}");
    assert_eq!(stats.trapped(TrapKind::Memory), 1, "{stats}");
    assert_eq!(stats.restarts.get(), 1, "{stats}");
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbounded_recursion_traps_as_a_stack_overflow_and_the_session_goes_on() {
    let host = Host::start("recursor", CallRules::default()).await;
    let conn = host.connection().await;
    let mut call = conn.start_text();
    call.expect_say("Hello from the recursor.").await.unwrap();

    call.say("recurse");
    call.say("echo alive");
    call.expect_say("alive").await.unwrap();

    let stats = &host.stats;
    assert_eq!(stats.traps(), 1, "{stats}");
    assert_eq!(stats.trapped(TrapKind::StackOverflow), 1, "{stats}");
    assert_eq!(stats.restarts.get(), 1, "{stats}");
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saved_state_is_read_back_by_the_fresh_instance_after_a_trap() {
    let host = Host::start("conformance", CallRules::default()).await;
    let conn = host.connection().await;
    let mut call = conn.start_text();
    call.expect_say("Hello from the conformance agent.")
        .await
        .unwrap();

    call.say("echo a");
    call.expect_say("a").await.unwrap();
    call.say("echo b");
    call.expect_say("b").await.unwrap();
    call.say("panic");
    // The agent saves its counter before it runs the command: "echo a", "echo b", "panic" and "count"
    // itself make 4, and the 3 before the panic were kept by the host, not by the instance that trapped.
    call.say("count");
    call.expect_say("utterances: 4").await.unwrap();

    let stats = &host.stats;
    assert_eq!(stats.trapped(TrapKind::Panic), 1, "{stats}");
    assert_eq!(stats.restarts.get(), 1, "{stats}");
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_traps_within_a_minute_hang_up_under_the_default_policy() {
    let host = Host::start("panicker", CallRules::default()).await;
    let conn = host.connection().await;
    let mut call = conn.start_text();
    call.expect_say("Hello from the panicker.").await.unwrap();

    for _ in 0..3 {
        call.say("panic");
    }
    let tool = call.expect_tool("hangup").await.unwrap();
    assert!(
        tool.get("arguments").is_none_or(|a| a.is_null()),
        "hangup takes no arguments: {tool}"
    );
    assert_eq!(ended(&call).await, "agent_hung_up");
    call.expect_nothing(Duration::from_millis(200))
        .await
        .unwrap();

    let stats = &host.stats;
    assert_eq!(stats.trapped(TrapKind::Panic), 3, "{stats}");
    // The third trap is not followed by a fresh instance: the host gave up on the agent for this call.
    assert_eq!(stats.restarts.get(), 2, "{stats}");
    assert_eq!(stats.policies_applied.get(), 1, "{stats}");
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_traps_within_a_minute_transfer_under_a_transfer_policy() {
    let rules = CallRules {
        policy: FailurePolicy::transfer("number", "+14155550123").unwrap(),
        ..CallRules::default()
    };
    let host = Host::start("panicker", rules).await;
    let conn = host.connection().await;
    let mut call = conn.start_text();
    call.expect_say("Hello from the panicker.").await.unwrap();

    for _ in 0..3 {
        call.say("panic");
    }
    let tool = call.expect_tool("transfer").await.unwrap();
    assert_eq!(
        tool["arguments"],
        serde_json::json!({"to": {"kind": "number", "value": "+14155550123"}})
    );
    assert_eq!(ended(&call).await, "transferred");
    call.expect_nothing(Duration::from_millis(200))
        .await
        .unwrap();

    let stats = &host.stats;
    assert_eq!(stats.trapped(TrapKind::Panic), 3, "{stats}");
    assert_eq!(stats.policies_applied.get(), 1, "{stats}");
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_on_one_call_never_reaches_another_call() {
    let host = Host::start("panicker", CallRules::default()).await;
    let conn = host.connection().await;
    let mut trapping = conn.start_text();
    let mut other = conn.start_text();
    trapping
        .expect_say("Hello from the panicker.")
        .await
        .unwrap();
    other.expect_say("Hello from the panicker.").await.unwrap();

    other.say("echo one");
    trapping.say("panic");
    other.say("echo two");
    other.expect_say("one").await.unwrap();
    other.expect_say("two").await.unwrap();
    trapping.say("echo back");
    trapping.expect_say("back").await.unwrap();
    other.say("echo three");
    other.expect_say("three").await.unwrap();
    other
        .expect_nothing(Duration::from_millis(100))
        .await
        .unwrap();
    trapping
        .expect_nothing(Duration::from_millis(100))
        .await
        .unwrap();

    let stats = &host.stats;
    assert_eq!(stats.traps(), 1, "{stats}");
    // Only the trapping call got a fresh instance.
    assert_eq!(stats.restarts.get(), 1, "{stats}");
    assert!(other.state().is_some_and(|s| s.ended.is_none()));
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_error_is_counted_and_the_session_goes_on_with_the_same_instance() {
    let host = Host::start("panicker", CallRules::default()).await;
    let conn = host.connection().await;
    let mut call = conn.start_text();
    call.expect_say("Hello from the panicker.").await.unwrap();

    // "echo " asks to say an empty text: the host refuses it as invalid, and the panicker's `?` turns the
    // refusal into an `Err` from on-user-said.
    call.say("echo ");
    call.say("echo ok");
    call.expect_say("ok").await.unwrap();
    call.expect_nothing(Duration::from_millis(100))
        .await
        .unwrap();

    let stats = &host.stats;
    assert_eq!(stats.handler_errors.get(), 1, "{stats}");
    assert_eq!(stats.traps(), 0, "{stats}");
    assert_eq!(stats.restarts.get(), 0, "{stats}");
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_in_tool_for_sent_does_not_count_against_the_cpu_deadline() {
    let rules = CallRules {
        limits: Limits {
            cpu_per_call: Duration::from_millis(50),
            ..Limits::default()
        },
        ..CallRules::default()
    };
    let host = Host::start("conformance", rules).await;
    let conn = host.connection().await;
    let mut call = conn.start_text();
    call.expect_say("Hello from the conformance agent.")
        .await
        .unwrap();
    call.plan_tool("hold", sentsim::ToolPlan::Hold);
    call.say("hold");
    let tool = call.expect_tool("hold").await.unwrap();
    // The handler waits in `tool` ten times its CPU budget before Sent answers.
    tokio::time::sleep(Duration::from_millis(500)).await;
    call.answer(tool["call_ref"].as_str().unwrap(), "hold", None);
    call.say("echo still the same instance");
    call.expect_say("still the same instance").await.unwrap();
    assert_eq!(host.stats.traps(), 0, "{}", host.stats);
    assert_eq!(host.stats.restarts.get(), 0);
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_is_reported_as_its_cause_in_one_line_and_the_guest_function_it_happened_in() {
    let code = sandbox().load(&guest("panicker")).unwrap();
    let mut instance = Instance::new(&code, Quiet::imports(), Limits::default())
        .await
        .unwrap();
    let panic = Event::UserSaid(UserSaid {
        text: "panic".into(),
        correction: false,
    });
    let Outcome::Trapped { kind, report } = instance.call(&panic).await else {
        panic!("the panicker did not trap");
    };
    assert_eq!(kind, TrapKind::Panic);
    assert!(report.cause.starts_with("wasm trap: "), "{report:?}");
    assert!(!report.cause.contains('\n'), "{report:?}");
    // The test guests are stripped of names, so the function is known by its index.
    let function = report.function.clone().expect("the guest function");
    assert!(function.contains("wasm function "), "{report:?}");
    let frames: Vec<&str> = report.backtrace.lines().collect();
    assert_eq!(frames.first(), Some(&function.as_str()), "{report:?}");
    assert!(frames.len() > 1, "{report:?}");
}

/// Waits until `done` holds of the host's stats.
async fn until_stats(host: &Host, what: &str, done: impl Fn(&voicehost::stats::Stats) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(&host.stats) {
        assert!(Instant::now() < deadline, "{what}: {}", host.stats);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_in_on_restart_traps_again_until_the_failure_policy_ends_the_call() {
    let host = Host::start("hoarder", CallRules::default()).await;
    let conn = host.connection().await;
    let mut neighbour = conn.start_text();
    neighbour
        .expect_say("Hello from the hoarder.")
        .await
        .unwrap();
    let mut call = conn.start_text();
    call.expect_say("Hello from the hoarder.").await.unwrap();

    // One trap in `on-user-said`, then one in each fresh instance's `on-restart`, until the third.
    call.say("trap-in restart");
    call.expect_tool("hangup").await.unwrap();
    assert_eq!(ended(&call).await, "agent_hung_up");
    let stats = &host.stats;
    assert_eq!(stats.trapped(TrapKind::Panic), 3, "{stats}");
    assert_eq!(stats.restarts.get(), 2, "{stats}");
    assert_eq!(stats.policies_applied.get(), 1, "{stats}");

    neighbour.say("echo still here");
    neighbour.expect_say("still here").await.unwrap();
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_in_on_session_end_is_counted_and_no_fresh_instance_follows() {
    let host = Host::start("hoarder", CallRules::default()).await;
    let conn = host.connection().await;
    let mut call = conn.start_text();
    call.expect_say("Hello from the hoarder.").await.unwrap();
    call.say("trap-in end");
    call.expect_say("armed").await.unwrap();

    call.end("completed");
    until_stats(&host, "the trap in on-session-end", |s| {
        s.trapped(TrapKind::Panic) == 1 && s.sessions_ended.get() == 1
    })
    .await;
    call.expect_nothing(Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(host.stats.restarts.get(), 0, "{}", host.stats);
    assert_eq!(host.stats.policies_applied.get(), 0, "{}", host.stats);

    let mut next = conn.start_text();
    next.expect_say("Hello from the hoarder.").await.unwrap();
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_in_on_session_lost_is_counted_and_no_fresh_instance_follows() {
    let host = Host::start("hoarder", CallRules::default()).await;
    let conn = host.connection().await;
    let mut call = conn.start_text();
    call.expect_say("Hello from the hoarder.").await.unwrap();
    call.say("trap-in lost");
    call.expect_say("armed").await.unwrap();

    // Sent refuses the resume: the call is lost, and `on-session-lost` traps.
    call.expire_resume();
    conn.drop_abruptly();
    until_stats(&host, "the trap in on-session-lost", |s| {
        s.trapped(TrapKind::Panic) == 1 && s.sessions_lost.get() == 1
    })
    .await;
    assert_eq!(host.stats.restarts.get(), 0, "{}", host.stats);
    assert_eq!(host.stats.policies_applied.get(), 0, "{}", host.stats);

    let mut next = host.connection().await.start_text();
    next.expect_say("Hello from the hoarder.").await.unwrap();
    host.finish().await;
}
