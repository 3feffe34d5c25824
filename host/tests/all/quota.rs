//! Quotas: what one tenant may keep (`[tenants.quota]`): versions, stored bytes and compiled bytes. An
//! upload over any is refused `409 over_quota` with nothing kept, the other tenant is unaffected, and
//! deleting versions makes room.

use serde_json::Value;
use voicehost_testkit::{metric, Hosting, ACME_TOKEN, GLOBEX_TOKEN};

/// The conformance agent with a custom section of `pad` bytes named after `n` appended: the same agent,
/// another component (its own digest), `pad` bytes larger.
fn variant(n: usize, pad: usize) -> Vec<u8> {
    fn leb(mut value: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (value & 0x7f) as u8;
            value >>= 7;
            if value == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let name = format!("variant-{n}");
    let mut body = Vec::new();
    leb(name.len(), &mut body);
    body.extend_from_slice(name.as_bytes());
    body.resize(body.len() + pad, 0);
    let mut wasm = voicehost_testkit::guest("conformance");
    wasm.push(0);
    leb(body.len(), &mut wasm);
    wasm.extend_from_slice(&body);
    wasm
}

async fn upload(hosting: &Hosting, token: &str, agent: &str, wasm: Vec<u8>) -> (u16, Value) {
    let path = format!("/v1/agents/{agent}/versions");
    hosting.api("POST", &path, Some(token), wasm).await
}

async fn usage(hosting: &Hosting, token: &str) -> Value {
    let (status, answer) = hosting.api("GET", "/v1/usage", Some(token), vec![]).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

/// The refusal's message, once it is checked to be `409 over_quota`.
fn over_quota((status, answer): (u16, Value)) -> String {
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["code"], "over_quota", "{answer}");
    answer["error"]["message"].as_str().unwrap().to_string()
}

async fn compilations(hosting: &Hosting) -> f64 {
    metric(&hosting.metrics().await, "voicehost_compilations_total")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_over_the_tenants_versions_is_refused_before_compiling_and_a_delete_makes_room() {
    let hosting = Hosting::start("quota-versions", "[tenants.quota]\nversions = 2").await;
    for n in 0..2 {
        let (status, answer) = upload(&hosting, ACME_TOKEN, "agent_acme", variant(n, 0)).await;
        assert_eq!(status, 201, "{answer}");
    }
    let compiled = compilations(&hosting).await;
    let message = over_quota(upload(&hosting, ACME_TOKEN, "agent_acme2", variant(2, 0)).await);
    assert!(message.contains("quota.versions = 2"), "{message}");
    assert_eq!(
        compilations(&hosting).await,
        compiled,
        "the refused upload was compiled"
    );
    let (status, _) = hosting
        .api("GET", "/v1/agents/agent_acme2", Some(ACME_TOKEN), vec![])
        .await;
    assert_eq!(status, 404, "nothing was stored");
    assert_eq!(usage(&hosting, ACME_TOKEN).await["usage"]["versions"], 2);

    // The other tenant's quota is its own.
    for n in 0..3 {
        let (status, answer) = upload(&hosting, GLOBEX_TOKEN, "agent_globex", variant(n, 0)).await;
        assert_eq!(status, 201, "{answer}");
    }

    // Deleting a version makes room.
    let (status, answer) = hosting
        .api(
            "DELETE",
            "/v1/agents/agent_acme/versions/1",
            Some(ACME_TOKEN),
            vec![],
        )
        .await;
    assert_eq!(status, 204, "{answer}");
    let (status, answer) = upload(&hosting, ACME_TOKEN, "agent_acme2", variant(2, 0)).await;
    assert_eq!(status, 201, "{answer}");
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_over_the_tenants_stored_or_compiled_bytes_are_refused_and_leave_nothing() {
    let hosting = Hosting::start(
        "quota-bytes",
        "[tenants.quota]\nstored_mib = 1\ncompiled_mib = 1",
    )
    .await;
    // Over the stored bytes at once: refused before compiling.
    let compiled = compilations(&hosting).await;
    let message = over_quota(upload(&hosting, ACME_TOKEN, "agent_acme", variant(0, 1 << 20)).await);
    assert!(
        message.contains("of components, over its quota (quota.stored_mib = 1)"),
        "{message}"
    );
    assert_eq!(compilations(&hosting).await, compiled);
    assert!(
        hosting.files("components").is_empty(),
        "{:?}",
        hosting.files("components")
    );

    // Versions of other bytes until their compiled forms pass 1 MiB: the one that would is refused, and
    // neither it nor its compiled form is kept.
    let mut kept = 0;
    let message = loop {
        let (status, answer) =
            upload(&hosting, ACME_TOKEN, "agent_acme", variant(kept + 1, 0)).await;
        if status != 201 {
            break over_quota((status, answer));
        }
        kept += 1;
        assert!(kept < 64, "1 MiB held 64 compiled agents");
    };
    assert!(
        message.contains("of compiled code, over its quota (quota.compiled_mib = 1)"),
        "{message}"
    );
    assert!(kept >= 1, "not even one version fitted");
    let acme = usage(&hosting, ACME_TOKEN).await;
    assert_eq!(acme["usage"]["versions"], kept as u64, "{acme}");
    assert!(
        acme["usage"]["compiled_bytes"].as_u64().unwrap() <= 1 << 20,
        "{acme}"
    );
    assert_eq!(acme["quota"]["compiled_bytes"], 1 << 20, "{acme}");
    assert_eq!(hosting.files("components").len(), kept);
    let cwasm = hosting
        .files("compiled")
        .iter()
        .filter(|f| f.ends_with(".cwasm"))
        .count();
    assert_eq!(cwasm, kept, "{:?}", hosting.files("compiled"));

    // Another tenant is not charged for acme's bytes, even the same ones.
    let (status, answer) = upload(&hosting, GLOBEX_TOKEN, "agent_globex", variant(1, 0)).await;
    assert_eq!(status, 201, "{answer}");
    let globex = usage(&hosting, GLOBEX_TOKEN).await;
    assert_eq!(globex["usage"]["versions"], 1, "{globex}");
    assert_eq!(
        globex["usage"]["stored_bytes"],
        variant(1, 0).len(),
        "{globex}"
    );
    let compiled = globex["usage"]["compiled_bytes"].as_u64().unwrap();
    assert!(compiled > 0 && compiled <= 1 << 20, "{globex}");
    // Nothing of the refused uploads was left where uploads are received.
    assert!(
        hosting.files("uploads").is_empty(),
        "{:?}",
        hosting.files("uploads")
    );
    hosting.finish().await;
}
