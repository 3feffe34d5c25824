//! What the `agent` world gives a component, in words: each import the host does not provide, named with
//! why and what to do instead, so an upload (or `voicehost check`) refused for its imports says more than
//! the linker's first mismatch.

use wasmtime::component::Component;
use wasmtime::Engine;

/// The component's imports the host does not provide, each as `name: why, and what to do`.
pub(super) fn unprovided(engine: &Engine, component: &Component) -> Vec<String> {
    component
        .component_type()
        .imports(engine)
        .filter_map(|(name, _)| explain(name).map(|why| format!("{name}: {why}")))
        .collect()
}

/// The core WASI packages the host links (wasmtime 48's WASI 0.2.12), with `wasi:http`'s `types` and
/// `outgoing-handler`.
const CORE_WASI: [&str; 7] = [
    "wasi:cli",
    "wasi:clocks",
    "wasi:filesystem",
    "wasi:io",
    "wasi:random",
    "wasi:sockets",
    "wasi:http",
];

/// Whether an import's `version` resolves to a package the host links at `linked`, as wasmtime's linker
/// matches them: the same version, or one on the same semver track (the same major, or for 0.x the same
/// minor) when neither is a pre-release.
fn resolves(version: &str, linked: &str) -> bool {
    let version = version.split('+').next().unwrap_or_default();
    if version == linked {
        return true;
    }
    let track = |v: &str| -> Option<(u64, u64)> {
        if v.contains('-') {
            return None;
        }
        let mut parts = v.split('.').map(str::parse::<u64>);
        let (Some(Ok(major)), Some(Ok(minor)), Some(Ok(_)), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        // 0.0.z matches only itself; 0.y.z its minor; x.y.z its major.
        Some(if major > 0 {
            (major, u64::MAX)
        } else {
            (0, minor)
        })
        .filter(|t| *t != (0, 0))
    };
    matches!((track(version), track(linked)), (Some(a), Some(b)) if a == b)
}

/// Why the host does not provide the import `name` (`namespace:package/interface@version`), or `None`
/// when it does.
fn explain(name: &str) -> Option<String> {
    let (path, version) = name.split_once('@').unwrap_or((name, ""));
    let (package, interface) = path.split_once('/').unwrap_or((path, ""));
    let why = match package {
        "voicehost:agent" if resolves(version, "0.1.0") => return None,
        "voicehost:agent" => {
            "this host speaks voicehost:agent@0.1.0: build against the wit/ of the host you upload to"
                .to_string()
        }
        "wasi:http" if interface == "incoming-handler" => {
            "an agent serves no HTTP: Sent's events reach its `handler` export".into()
        }
        "wasi:http" if !matches!(interface, "types" | "outgoing-handler") => {
            "only wasi:http's `types` and `outgoing-handler` are linked".into()
        }
        core if CORE_WASI.contains(&core) && resolves(version, "0.2.12") => return None,
        core if CORE_WASI.contains(&core) => format!(
            "{} is not linked, only WASI 0.2 releases (0.2.0 to 0.2.12; no release candidate): build for \
             wasm32-wasip2 with a WASI 0.2 toolchain",
            if version.is_empty() {
                "an import without a version".to_string()
            } else {
                format!("WASI {version}")
            }
        ),
        "wasi:keyvalue" => {
            "no key-value store: keep a call's state with `save` and `load` (voicehost:agent/session)"
                .into()
        }
        "wasi:config" => "no runtime config: read the call's `context` (`info`)".into(),
        "wasi:logging" => "no wasi:logging: log with voicehost:agent/log (or stdout and stderr)".into(),
        proposal if proposal.starts_with("wasi:") => {
            "a WASI proposal the host does not link: agents get WASI 0.2's core interfaces only".into()
        }
        spin if spin.starts_with("fermyon:") || spin.starts_with("spin:") => {
            "a Spin SDK import: build the agent with voicehost-agent (or bindings of wit/), not Spin's SDK"
                .into()
        }
        _ => "not in the voicehost:agent world (WASI 0.2, wasi:http/outgoing-handler and \
              voicehost:agent): remove what imports it"
            .into(),
    };
    Some(why)
}

#[cfg(test)]
mod tests {
    use super::{explain, resolves};

    #[test]
    fn versions_resolve_as_wasmtimes_linker_matches_them() {
        for (version, linked) in [
            ("0.2.0", "0.2.12"),
            ("0.2.12", "0.2.12"),
            ("0.2.13", "0.2.12"),
            ("0.1.1", "0.1.0"),
            ("0.1.0+build.5", "0.1.0"),
        ] {
            assert!(resolves(version, linked), "{version} → {linked}");
        }
        for (version, linked) in [
            ("0.2.0-rc-2023-11-10", "0.2.12"),
            ("0.3.0", "0.2.12"),
            ("1.0.0", "0.2.12"),
            ("0.0.1", "0.0.2"),
            ("", "0.2.12"),
            ("0.2", "0.2.12"),
        ] {
            assert!(!resolves(version, linked), "{version} → {linked}");
        }
    }

    #[test]
    fn what_the_host_links_needs_no_word_and_the_rest_says_what_to_do() {
        for provided in [
            "wasi:cli/environment@0.2.0",
            "wasi:io/streams@0.2.6",
            "wasi:filesystem/preopens@0.2.3",
            "wasi:http/outgoing-handler@0.2.0",
            "voicehost:agent/session@0.1.0",
            "voicehost:agent/log@0.1.1",
        ] {
            assert_eq!(explain(provided), None, "{provided}");
        }
        for (import, says) in [
            ("wasi:keyvalue/store@0.2.0-draft", "`save` and `load`"),
            (
                "wasi:cli/environment@0.3.0-rc-2025-09-16",
                "only WASI 0.2 releases",
            ),
            (
                "wasi:io/streams@0.2.0-rc-2023-11-10",
                "no release candidate",
            ),
            ("wasi:http/incoming-handler@0.2.0", "serves no HTTP"),
            ("wasi:logging/logging@0.1.0-draft", "voicehost:agent/log"),
            ("wasi:nn/tensor@0.2.0-rc-2024-10-28", "a WASI proposal"),
            ("fermyon:spin/llm@2.0.0", "Spin SDK"),
            ("voicehost:agent/session@0.2.0", "voicehost:agent@0.1.0"),
            ("acme:tools/lookup@1.0.0", "remove what imports it"),
        ] {
            let why = explain(import).unwrap_or_else(|| panic!("{import} is not linked"));
            assert!(why.contains(says), "{import}: {why}");
        }
    }
}
