use super::*;

fn sent() -> (Sent, Instant) {
    let now = Instant::now();
    let mut sent = Sent::new(Config::default());
    sent.handle_open(now, 1, CONFORMANCE_AGENT, ConnSettings::default());
    sent.ready(now, 1);
    (sent, now)
}

fn texts(sent: &mut Sent) -> Vec<(ConnId, Value)> {
    std::iter::from_fn(|| sent.poll_transmit())
        .filter_map(|t| match t.message {
            Message::Text(text) => Some((t.conn, serde_json::from_str(&text).unwrap())),
            _ => None,
        })
        .collect()
}

fn violations(sent: &mut Sent) -> Vec<String> {
    std::iter::from_fn(|| sent.poll_event())
        .filter_map(|e| match e {
            Event::Violation { message, .. } => Some(message),
            Event::Record { .. } => None,
        })
        .collect()
}

fn resume(sent: &Sent, id: &str, received: usize) -> String {
    let token = sent.session(id).unwrap().token.clone().unwrap();
    format!(
        r#"{{"type":"session.resume","session_id":"{id}","token":"{token}","received":{received}}}"#
    )
}

#[test]
fn a_resume_on_another_connection_moves_the_session_and_replays_what_the_agent_did_not_read() {
    let (mut sent, now) = sent();
    let id = sent.start(1, &SessionSpec::text(), None);
    sent.user_said(&id, "one", false);
    sent.user_said(&id, "two", false);
    sent.handle_closed(now, 1, "dropped by Sent", false);
    sent.handle_open(now, 2, CONFORMANCE_AGENT, ConnSettings::default());
    sent.ready(now, 2);
    texts(&mut sent);
    // The agent read "one" (the start is not counted).
    let text = resume(&sent, &id, 1);
    sent.handle_text(now, 2, &text);
    let out = texts(&mut sent);
    let types: Vec<&str> = out
        .iter()
        .map(|(_, j)| j["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["session.resumed", "user.said"]);
    assert_eq!(out[1].1["text"], "two");
    assert_eq!(sent.session(&id).unwrap().conn, Some(2));
    assert!(violations(&mut sent).is_empty());
}

#[test]
fn a_resume_past_the_window_is_refused_and_the_call_is_lost() {
    let (mut sent, now) = sent();
    let id = sent.start(1, &SessionSpec::text(), None);
    sent.handle_closed(now, 1, "dropped by Sent", false);
    sent.handle_open(now, 2, CONFORMANCE_AGENT, ConnSettings::default());
    let later = now + Duration::from_millis(Config::default().window_ms + 1);
    texts(&mut sent);
    let text = resume(&sent, &id, 1);
    sent.handle_text(later, 2, &text);
    let out = texts(&mut sent);
    assert_eq!(out[0].1["error"]["code"], "resume_failed");
    assert!(sent.call_state(later, &id).unwrap().lost);
}

#[test]
fn a_resume_needing_frames_sent_no_longer_keeps_is_refused() {
    let (mut sent, now) = sent();
    let id = sent.start(1, &SessionSpec::text(), None);
    for n in 0..RETAINED_FRAMES + 1 {
        sent.user_said(&id, &format!("said {n}"), false);
    }
    sent.handle_closed(now, 1, "dropped by Sent", false);
    sent.handle_open(now, 2, CONFORMANCE_AGENT, ConnSettings::default());
    texts(&mut sent);
    let text = resume(&sent, &id, 0);
    sent.handle_text(now, 2, &text);
    assert_eq!(texts(&mut sent)[0].1["error"]["code"], "resume_failed");
    assert!(sent.session(&id).unwrap().lost.is_some());
}

#[test]
fn a_full_connection_refuses_a_resume_with_connection_full_and_keeps_the_call() {
    let (mut sent, now) = sent();
    let id = sent.start(1, &SessionSpec::text(), None);
    sent.handle_closed(now, 1, "dropped by Sent", false);
    let one = ConnSettings {
        max_sessions: Some(1),
        ..ConnSettings::default()
    };
    sent.handle_open(now, 2, CONFORMANCE_AGENT, one);
    sent.start(2, &SessionSpec::text(), None);
    texts(&mut sent);
    let text = resume(&sent, &id, 1);
    sent.handle_text(now, 2, &text);
    assert_eq!(texts(&mut sent)[0].1["error"]["code"], "connection_full");
    assert!(!sent.call_state(now, &id).unwrap().lost);
}

#[test]
fn a_delayed_resume_is_answered_when_its_timeout_comes() {
    let (mut sent, now) = sent();
    let id = sent.start(1, &SessionSpec::text(), None);
    sent.handle_closed(now, 1, "dropped by Sent", false);
    let slow = ConnSettings {
        resume_delay: Duration::from_millis(200),
        ..ConnSettings::default()
    };
    sent.handle_open(now, 2, CONFORMANCE_AGENT, slow);
    texts(&mut sent);
    let text = resume(&sent, &id, 1);
    sent.handle_text(now, 2, &text);
    assert!(texts(&mut sent).is_empty());
    let due = sent.poll_timeout().expect("a timer");
    sent.handle_timeout(due);
    assert_eq!(texts(&mut sent)[0].1["type"], "session.resumed");
}

#[test]
fn a_frame_for_a_session_on_another_connection_is_refused_and_is_a_violation() {
    let (mut sent, now) = sent();
    sent.handle_open(now, 2, CONFORMANCE_AGENT, ConnSettings::default());
    let id = sent.start(1, &SessionSpec::text(), None);
    texts(&mut sent);
    violations(&mut sent);
    let say = format!(r#"{{"type":"agent.say","session_id":"{id}","text":"hi"}}"#);
    sent.handle_text(now, 2, &say);
    assert_eq!(texts(&mut sent)[0].1["error"]["code"], "frame_not_allowed");
    assert_eq!(violations(&mut sent).len(), 1);
    assert_eq!(sent.session(&id).unwrap().received, 0);
}

#[test]
fn a_held_tool_waits_for_its_answer_and_a_successful_hangup_ends_the_session() {
    let (mut sent, now) = sent();
    let id = sent.start(1, &SessionSpec::text(), None);
    sent.plan_tool(&id, "hangup", ToolPlan::Hold);
    let call = format!(
        r#"{{"type":"tool.call","session_id":"{id}","call_ref":"t1","name":"hangup","args":{{}}}}"#
    );
    sent.handle_text(now, 1, &call);
    assert_eq!(sent.session(&id).unwrap().pending_tools.len(), 1);
    texts(&mut sent);
    sent.answer(&id, "t1", "hangup", None);
    let types: Vec<String> = texts(&mut sent)
        .iter()
        .map(|(_, j)| j["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(types, ["tool.result", "session.end"]);
    assert!(sent.session(&id).unwrap().pending_tools.is_empty());
}

#[test]
fn a_draining_connection_closes_with_1000_once_its_last_session_ends() {
    let (mut sent, _) = sent();
    let id = sent.start(1, &SessionSpec::text(), None);
    sent.drain(1);
    sent.end(&id, "caller_hung_up");
    let last = std::iter::from_fn(|| sent.poll_transmit()).last().unwrap();
    assert_eq!(last.message, Message::Close(1000));
}

#[test]
fn a_missing_pong_past_the_allowed_intervals_closes_with_1008() {
    let (mut sent, now) = sent();
    let interval = Duration::from_millis(Config::default().heartbeat_interval_ms);
    assert!(sent.heartbeat(now + interval, 1, 1, false));
    assert!(!sent.heartbeat(now + interval * 4, 1, 2, false));
    let last = std::iter::from_fn(|| sent.poll_transmit()).last().unwrap();
    assert_eq!(last.message, Message::Close(1008));
}
