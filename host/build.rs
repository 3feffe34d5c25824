//! The `handler` interface of each world the host serves, as a component exporting nothing else, made from
//! the world's WIT (`../wit`, `wit-0.2`, `wit-0.1`): an upload's handler types are compared with these
//! (`sandbox/world.rs`), so the WIT stays the one statement of them.

use anyhow::{Context, Result};
use std::path::PathBuf;
use wit_component::{ComponentEncoder, StringEncoding};
use wit_parser::{ManglingAndAbi, Resolve};

fn main() -> Result<()> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    for (dir, file) in [
        ("../wit", "handler-0.3.wasm"),
        ("wit-0.2", "handler-0.2.wasm"),
        ("wit-0.1", "handler-0.1.wasm"),
    ] {
        println!("cargo:rerun-if-changed={dir}");
        let mut resolve = Resolve::default();
        let (agent, _) = resolve
            .push_dir(dir)
            .with_context(|| format!("reading the WIT in {dir}"))?;
        let version = resolve.packages[agent]
            .name
            .version
            .clone()
            .context("voicehost:agent has a version")?;
        let reference = resolve.push_str(
            "reference.wit",
            &format!(
                "package voicehost:reference;\n\
                 world handler {{ export voicehost:agent/handler@{version}; }}\n"
            ),
        )?;
        let world = resolve.select_world(&[reference], Some("handler"))?;
        let mut module = wit_component::dummy_module(&resolve, world, ManglingAndAbi::Standard32);
        wit_component::embed_component_metadata(
            &mut module,
            &resolve,
            world,
            StringEncoding::UTF8,
        )?;
        let component = ComponentEncoder::default()
            .module(&module)?
            .validate(true)
            .encode()?;
        std::fs::write(out.join(file), component)?;
    }
    Ok(())
}
