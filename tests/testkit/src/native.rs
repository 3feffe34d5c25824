//! The conformance agent (examples/conformance) as host code rather than a component, behind the same
//! [`GuestImports`] a guest's imports reach: the load bench runs it beside the component to measure what
//! the sandbox costs, and a test keeps it serving.

use std::future::Future;
use std::pin::Pin;
use voicehost::sandbox::wit::{Media, UserSaid};
use voicehost::sandbox::{Event, GuestImports, NativeAgent, Outcome};

/// The key of the saved utterance counter, as the component's.
const COUNTER_KEY: &str = "utterances";

/// The conformance agent's actions, through the imports, for every event but `panic` (host code cannot
/// trap).
pub struct NativeConformance;

impl NativeAgent for NativeConformance {
    fn call<'a>(
        &'a self,
        imports: &'a dyn GuestImports,
        event: &'a Event,
    ) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>> {
        Box::pin(async move {
            match event {
                Event::Audio(samples) => imports.send_audio(samples.clone()),
                Event::SessionStart if matches!(imports.info().media, Media::Text) => {
                    let greeting = "Hello from the conformance agent.".into();
                    let _ = imports.say(greeting, None, None).await;
                }
                Event::UserSaid(said) => user_said(imports, said).await,
                Event::ToolResult(result) => {
                    if let Err(error) = &result.outcome {
                        let text = format!("Tool failed: {}", error.code);
                        let _ = imports.say(text, None, None).await;
                    }
                }
                _ => {}
            }
            Outcome::Ok
        })
    }
}

async fn user_said(imports: &dyn GuestImports, said: &UserSaid) {
    let count = imports
        .load(COUNTER_KEY)
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .and_then(|text| text.parse::<u64>().ok())
        .unwrap_or(0)
        + 1;
    let saved = imports.save(COUNTER_KEY.into(), count.to_string().into_bytes());
    if saved.is_err() || (said.correction && imports.clear().await.is_err()) {
        return;
    }
    let (command, rest) = said.text.split_once(' ').unwrap_or((&said.text, ""));
    let _ = match command {
        "echo" => imports.say(rest.into(), None, None).await,
        "stream" => {
            let (word, remainder) = rest.split_once(' ').unwrap_or((rest, ""));
            match imports.say(word.into(), Some(false), None).await {
                Ok(()) => imports.say(remainder.into(), None, None).await,
                refused => refused,
            }
        }
        "count" => {
            imports
                .say(format!("utterances: {count}"), None, None)
                .await
        }
        "transfer" => {
            let to = r#"{"to":{"kind":"user","value":"conformance-desk"}}"#;
            imports
                .tool("transfer".into(), Some(to.into()))
                .await
                .map(drop)
        }
        "hangup" => imports.tool("hangup".into(), None).await.map(drop),
        "dtmf" => {
            let digits = serde_json::json!({ "digits": rest }).to_string();
            imports
                .tool("send_dtmf".into(), Some(digits))
                .await
                .map(drop)
        }
        "hold" => {
            let held = r#"{"held":true}"#.into();
            imports.tool("hold".into(), Some(held)).await.map(drop)
        }
        _ => Ok(()),
    };
}
