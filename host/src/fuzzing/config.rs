//! The harness of `voicehost.toml`: the cargo-fuzz target `config`. The input, as text, goes through
//! [`ServeConfig::parse`], [`ServeConfig::anchor`] and [`ServeConfig::tenants_with`], every check `serve` makes at start and on
//! reload, with each key "read" as its environment variable's name (so the fuzzer writes the keys too).
//!
//! What must hold: nothing panics; a refusal says why; a config accepted is one the host can run, with every
//! value inside its stated bound (connections, the Sent URL, each tenant's and agent's limits, the HTTP
//! policy's timeout and response cap, the keys) and no byte count or deadline that overflows; and no refusal
//! quotes a key.

use crate::agent::Dial;
use crate::sandbox::limits::{self, RANGES};
use crate::sandbox::outbound::{MAX_RESPONSE_BYTES, MAX_TIMEOUT};
use crate::tenancy::{valid_agent_id, KeySource, ServeConfig, MAX_CONNECTIONS};
use std::collections::BTreeSet;

/// The longest config text an input may be (a real one is a few KiB).
const MAX_TEXT: usize = 64 << 10;

/// Runs one input; panics when a rule breaks.
pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(&data[..data.len().min(MAX_TEXT)]);
    let mut config = match ServeConfig::parse(&text) {
        Ok(config) => config,
        Err(error) => {
            assert!(!error.to_string().is_empty(), "a refusal says why");
            return;
        }
    };
    // As `ServeConfig::read` anchors it: afterwards no path of the config is relative.
    if let Err(error) = config.anchor(std::path::Path::new("/etc/voicehost")) {
        assert!(!error.to_string().is_empty(), "a refusal says why");
        return;
    }
    let admin = &config.admin;
    for path in [
        Some(&config.data_dir),
        admin.tls_cert.as_ref(),
        admin.tls_key.as_ref(),
    ]
    .into_iter()
    .chain(config.tenants.iter().map(|t| t.api_key_file.as_ref()))
    .flatten()
    {
        assert!(path.is_absolute(), "{} is relative", path.display());
    }
    assert!((1..=MAX_CONNECTIONS).contains(&config.connections));
    assert!((1..=limits::MAX_CALLS_CAP).contains(&config.max_calls));
    assert!(
        Dial::check_url(&config.sent_url).is_ok(),
        "{}",
        config.sent_url
    );

    // A key made from where it is, so the fuzzer cannot simply write it into the config.
    let key_of = |source: KeySource<'_>| {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        match source {
            KeySource::Env(name) => name.hash(&mut hasher),
            KeySource::File(path) => path.hash(&mut hasher),
        }
        format!("sk_{:016x}", hasher.finish())
    };
    let keys: Vec<String> = config
        .tenants
        .iter()
        .filter_map(|t| t.key_source().ok().map(key_of))
        .collect();
    let tenants = match config.tenants_with(|source| Ok(key_of(source))) {
        Ok(tenants) => tenants,
        Err(error) => {
            let error = format!("{error:#}");
            // A refusal may quote the config (a tenant's id), never a key that is not in it.
            for key in keys.iter().filter(|key| !text.contains(key.as_str())) {
                assert!(
                    !error.contains(key.as_str()),
                    "a refusal quotes a key: {error}"
                );
            }
            return;
        }
    };

    let mut ids = BTreeSet::new();
    for (tenant, written) in tenants.iter().zip(&config.tenants) {
        assert!(ids.insert(tenant.id.clone()), "tenant {} twice", tenant.id);
        let key = tenant.api_key.expose();
        assert!(!key.is_empty() && key.bytes().all(|b| b.is_ascii_graphic()));
        within_bounds(&tenant.limits);
        for agent in written.agents.keys() {
            assert!(valid_agent_id(agent), "{agent}");
            let limits = tenant.agent_limits(agent);
            within_bounds(&limits);
            assert!(limits.max_sessions <= tenant.limits.max_sessions);
            assert_eq!(tenant.agent_session_cap(agent), Some(limits.max_sessions));
        }
        assert!(
            tenant.http.timeout > std::time::Duration::ZERO && tenant.http.timeout <= MAX_TIMEOUT
        );
        assert!((1..=MAX_RESPONSE_BYTES).contains(&tenant.http.max_response_bytes));
        if let Some(kib) = written.http.max_response_kib {
            assert_eq!(tenant.http.max_response_bytes, kib * 1024);
        }
        assert_eq!(tenant.http.allow.len(), written.http.allow.len());
        assert!(tenant.reserved_calls <= tenant.limits.max_sessions);
    }
    // The reservations fit the pool and the guests' memory, however the tenants add up.
    let guest_memory = config.guest_memory_bytes();
    assert!(
        (16 << 20..=1 << 44).contains(&guest_memory),
        "{guest_memory}"
    );
    assert!(tenants.iter().map(|t| t.reserved_calls).sum::<usize>() <= config.max_calls);
    let reserved = tenants
        .iter()
        .map(|t| u128::from(t.reserved_memory))
        .sum::<u128>();
    assert!(reserved <= u128::from(guest_memory));
}

/// Every limit from 1 to its maximum, and what the host derives from it without overflow.
fn within_bounds(limits: &limits::ResolvedLimits) {
    assert_eq!(limits.check(), Ok(()));
    for ((key, min, max, _), value) in RANGES.iter().zip(limits.values()) {
        assert!((*min..=*max).contains(&value), "{key} = {value}");
    }
    assert_eq!(
        Some(limits.component_bytes()),
        limits.component_mib.checked_mul(1 << 20)
    );
    let wall = std::time::Duration::from_millis(limits.wall_ms);
    assert!(std::time::Instant::now().checked_add(wall).is_some());
}

/// Hand-written configs that reach every part of the parser, for the corpus.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let token = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8";
    let other = "6b86b273ff34fce19d6b804eff5a3f5747ada4ea22f1d49c01e52ddb7875b4b8";
    let seeds = [
        ("seed-minimal", "data_dir = \"data\"\n".to_string()),
        (
            "seed-host",
            "data_dir = \"/var/lib/voicehost\"\nsent_url = \"wss://voice.sent.dm/v1/agents/connect\"\nconnections = 2\n[admin]\nlisten = \"127.0.0.1:7070\"\nmetrics_token_sha256 = \"TOKEN\"\n[limits]\nmemory_mib = 64\ncpu_ms = 200\nwall_ms = 60000\nmax_sessions = 100\nlog_lines_per_second = 20\ncomponent_mib = 40\n".replace("TOKEN", token),
        ),
        (
            "seed-tenants",
            "data_dir = \"d\"\n[[tenants]]\nid = \"acme\"\ntoken_sha256 = \"TOKEN\"\napi_key_env = \"ACME_SENT_KEY\"\n[tenants.limits]\nmax_sessions = 50\nmemory_mib = 128\n[tenants.http]\nallow = [\"https://api.example.com\", \"http://127.0.0.1:8089\"]\ntimeout_ms = 5000\nmax_response_kib = 512\n[tenants.agents.agent_big.limits]\nmax_sessions = 10\ncpu_ms = 500\n[[tenants]]\nid = \"globex\"\ntoken_sha256 = \"OTHER\"\napi_key_file = \"/run/secrets/globex\"\n".replace("TOKEN", token).replace("OTHER", other),
        ),
        (
            "seed-reserved",
            "data_dir = \"d\"\nmax_calls = 200\nguest_memory_mib = 8192\n[[tenants]]\nid = \"acme\"\ntoken_sha256 = \"TOKEN\"\napi_key_env = \"ACME_SENT_KEY\"\nreserved_calls = 50\n[tenants.limits]\nmemory_mib = 32\n[[tenants]]\nid = \"globex\"\ntoken_sha256 = \"OTHER\"\napi_key_env = \"GLOBEX_SENT_KEY\"\nreserved_calls = 10\n".replace("TOKEN", token).replace("OTHER", other),
        ),
    ];
    seeds
        .into_iter()
        .map(|(name, text)| (name.to_string(), text.into_bytes()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzzing::corpus;

    #[test]
    fn the_seeds_are_accepted_configs() {
        for (name, bytes) in seeds() {
            let text = String::from_utf8(bytes).unwrap();
            let config = ServeConfig::parse(&text).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            config
                .tenants_with(|_| Ok("sk_test".into()))
                .unwrap_or_else(|e| panic!("{name}: {e:#}"));
            corpus::replay("config", &name, text.as_bytes(), run);
        }
    }

    /// The short version of the fuzzing, on every `cargo test`: the kept corpus, and each of its inputs
    /// changed a little twice (a fixed seed), replay cleanly.
    #[test]
    fn the_fuzz_corpus_replays_cleanly() {
        let files = corpus::files("config");
        assert!(
            files.len() >= 3,
            "the corpus is missing: {}",
            corpus::dir("config").display()
        );
        let mut rng = fastrand::Rng::with_seed(0xc0f1);
        for (path, bytes) in &files {
            let name = path.display().to_string();
            corpus::replay("config", &name, bytes, run);
            for _ in 0..2 {
                corpus::replay("config", &name, &corpus::mutate(bytes, &mut rng), run);
            }
        }
    }

    /// Writes the seeds into the corpus: `cargo test -p voicehost --lib fuzzing::config::tests::write_seeds
    /// -- --ignored`.
    #[test]
    #[ignore]
    fn write_seeds() {
        std::fs::create_dir_all(corpus::dir("config")).unwrap();
        for (name, bytes) in seeds() {
            std::fs::write(corpus::dir("config").join(name), bytes).unwrap();
        }
    }
}
