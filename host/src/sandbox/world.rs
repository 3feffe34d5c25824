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

/// Why the host does not provide the import `name` (`package:namespace/interface@version`), or `None` when
/// it does. The host links WASI 0.2 (wasmtime 48's 0.2.12; any 0.2 import resolves to it),
/// `wasi:http/types` and `outgoing-handler`, and `voicehost:agent@0.1.0`.
fn explain(name: &str) -> Option<String> {
    let (path, version) = name.split_once('@').unwrap_or((name, ""));
    let (package, interface) = path.split_once('/').unwrap_or((path, ""));
    let wasi_02 = version.starts_with("0.2.");
    let why = match package {
        "wasi:cli" | "wasi:clocks" | "wasi:filesystem" | "wasi:io" | "wasi:random"
        | "wasi:sockets"
            if wasi_02 =>
        {
            return None
        }
        "wasi:http" if wasi_02 && matches!(interface, "types" | "outgoing-handler") => return None,
        "voicehost:agent" if version == "0.1.0" => return None,
        "voicehost:agent" => {
            "this host speaks voicehost:agent@0.1.0: build against the wit/ of the host you upload to"
                .into()
        }
        "wasi:http" if interface == "incoming-handler" => {
            "an agent serves no HTTP: Sent's events reach its `handler` export".into()
        }
        "wasi:keyvalue" => {
            "no key-value store: keep a call's state with `save` and `load` (voicehost:agent/session)"
                .into()
        }
        "wasi:config" => "no runtime config: read the call's `context` (`info`)".into(),
        package if package.starts_with("wasi:") && !wasi_02 => format!(
            "WASI {} is not linked, only WASI 0.2: build for wasm32-wasip2 with a WASI 0.2 toolchain",
            if version.is_empty() { "without a version" } else { version }
        ),
        package if package.starts_with("fermyon:") || package.starts_with("spin:") => {
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
    use super::explain;

    #[test]
    fn what_the_host_links_needs_no_word_and_the_rest_says_what_to_do() {
        for provided in [
            "wasi:cli/environment@0.2.0",
            "wasi:io/streams@0.2.6",
            "wasi:filesystem/preopens@0.2.3",
            "wasi:http/outgoing-handler@0.2.0",
            "voicehost:agent/session@0.1.0",
        ] {
            assert_eq!(explain(provided), None, "{provided}");
        }
        for (import, says) in [
            ("wasi:keyvalue/store@0.2.0-draft", "`save` and `load`"),
            ("wasi:cli/environment@0.3.0-rc-2025-09-16", "only WASI 0.2"),
            ("wasi:http/incoming-handler@0.2.0", "serves no HTTP"),
            ("fermyon:spin/llm@2.0.0", "Spin SDK"),
            ("voicehost:agent/session@0.2.0", "voicehost:agent@0.1.0"),
            ("acme:tools/lookup@1.0.0", "remove what imports it"),
        ] {
            let why = explain(import).unwrap_or_else(|| panic!("{import} is not linked"));
            assert!(why.contains(says), "{import}: {why}");
        }
    }
}
