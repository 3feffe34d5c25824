//! voicehost: serves Sent voice agent calls (protocol 0.2.0, `sent.voice.v1`), running each call's agent
//! logic as a sandboxed WebAssembly component instance. Every rule of the protocol is in the core,
//! [`voicehost_proto`]; this crate is the I/O around it, the sandbox, tenancy and the admin API.
//!
//! Data flows one way: socket → [`agent::connection`] (reader, through the core's intake) → [`agent`] (the
//! core's router routes by session or stream to the call's machine) → the call's task → [`sandbox`] (the
//! guest) → the guest's imports → the call's machine → the connection's outbox → writer → socket.
//!
//! The modules, each importing only those below it: [`content`] (content addresses, atomic files),
//! [`tls`] (rustls: the admin API's certificate, the TLS clients), [`sandbox`] (the engine, compiling,
//! instances, their limits and HTTP policy), [`stats`] (what an agent counts, exported to Prometheus),
//! [`agent`] (one agent's connections, calls and admission, around the core), [`tenancy`] (`voicehost
//! serve`: config, registry, the served agents), [`api`] (the admin HTTP API: routes, views, metrics),
//! [`cli`] (the operator's side of the admin API: `voicehost agents` and `voicehost token`, and their
//! HTTP client).

pub mod agent;
pub mod api;
pub mod cli;
pub mod content;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod logging;
pub mod sandbox;
pub mod stats;
pub mod tenancy;
pub mod tls;

#[cfg(test)]
mod layering {
    use std::collections::BTreeMap;
    use std::path::Path;

    /// The modules bottom up, as the crate's doc lists them; `logging` sits beside them, `fuzzing` above them all.
    const ORDER: &[&str] = &[
        "logging", "content", "tls", "sandbox", "stats", "agent", "tenancy", "api", "cli",
        "fuzzing",
    ];

    /// Every `crate::<module>` a top-level module's files name, comments left out.
    fn imports() -> BTreeMap<String, Vec<String>> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut stack = vec![src.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let relative = path
                    .strip_prefix(&src)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                let module = relative.split(['/', '.']).next().unwrap().to_string();
                let text = std::fs::read_to_string(&path).unwrap();
                for line in text.lines() {
                    let code = line.split("//").next().unwrap();
                    for (at, _) in code.match_indices("crate::") {
                        let name: String = code[at + "crate::".len()..]
                            .chars()
                            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                            .collect();
                        if name != module && ORDER.contains(&name.as_str()) {
                            found.entry(module.clone()).or_default().push(name);
                        }
                    }
                }
            }
        }
        found
    }

    #[test]
    fn no_module_imports_one_above_it() {
        let rank = |name: &str| ORDER.iter().position(|m| *m == name);
        let mut upward = Vec::new();
        for (module, names) in imports() {
            let Some(own) = rank(&module) else { continue };
            for name in names {
                if rank(&name).is_some_and(|theirs| theirs > own) {
                    upward.push(format!("{module} imports {name}"));
                }
            }
        }
        upward.sort();
        upward.dedup();
        assert!(
            upward.is_empty(),
            "imports against the layering: {upward:?}"
        );
    }

    #[test]
    fn every_top_level_module_has_its_place() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for entry in std::fs::read_dir(src).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            let module = name.trim_end_matches(".rs");
            if module != "lib" && module != "main" {
                assert!(ORDER.contains(&module), "{module} is not in ORDER");
            }
        }
    }
}
