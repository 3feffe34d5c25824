//! `voicehost agents` and `voicehost token`: the operator's side of the admin API of `voicehost serve`
//! (described in `host/openapi.json`); and an agent author's: `voicehost new` (`new.rs`), `voicehost
//! call` (`call.rs`), `voicehost test` (`agent_tests.rs`) and `voicehost check` (`check.rs`). The client
//! speaks plain HTTP/1.1 over hyper, one request per connection, and never shows the admin token: not in
//! output, not in an error.

use crate::api::views::{
    ActivateRequest, AgentList, AgentView, ErrorBody, PartyView, SessionList, UsageView,
    VersionView,
};
use crate::tenancy::{token_sha256, valid_agent_id, AGENT_ID_RULE};
use anyhow::{anyhow, bail, Context as _, Result};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::fmt;
use std::io::{BufRead as _, IsTerminal as _, Read as _};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::TcpStream;
use voicehost_proto::call::FailurePolicy;

/// Where `voicehost serve` listens for admin requests unless told otherwise.
pub(super) const DEFAULT_ADMIN: &str = "http://127.0.0.1:7070";
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// More than any answer of the API should ever be.
pub(super) const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Talks to the admin API of `voicehost serve`. The tenant's admin token comes from --token-file or the
/// VOICEHOST_TOKEN environment variable, never from a flag (flags show in `ps`).
#[derive(clap::Args)]
pub struct AgentsArgs {
    /// The admin API of `voicehost serve`: http:// on its own machine, https:// when it serves TLS
    /// (`[admin] tls_cert`).
    #[arg(long, global = true, value_name = "URL", env = "VOICEHOST_ADMIN", default_value = DEFAULT_ADMIN)]
    admin: String,
    /// A file holding the tenant's admin token (instead of the VOICEHOST_TOKEN environment variable).
    #[arg(long, global = true, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// For an https:// admin API: PEM certificates to trust besides the web's roots (a private CA, or
    /// the host's self-signed certificate).
    #[arg(long, global = true, value_name = "PATH", env = "VOICEHOST_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Seconds to wait for a whole request (an upload waits for the host to compile the component).
    #[arg(long, global = true, value_name = "SECS", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    #[command(subcommand)]
    command: AgentsCommand,
}

#[derive(clap::Subcommand, Debug, PartialEq, Eq)]
enum AgentsCommand {
    /// The tenant's agents: active version, number of versions, live calls, failure policy.
    List,
    /// One agent and its versions.
    Show {
        /// The agent's id, as Sent knows it (agent_…).
        #[arg(value_name = "AGENT", value_parser = agent_id)]
        agent: String,
    },
    /// Upload a component (.wasm) as the agent's next version; the host compiles and checks it before
    /// storing anything. The first upload for an agent id creates the agent.
    Upload {
        /// The agent's id, as Sent knows it (agent_…).
        #[arg(value_name = "AGENT", value_parser = agent_id)]
        agent: String,
        /// The component, e.g. target/wasm32-wasip2/release/my_agent.wasm.
        file: PathBuf,
        /// Make it the active version at once (new calls get it; live calls finish on theirs).
        #[arg(long)]
        activate: bool,
    },
    /// Make a version the active one: new calls get it, live calls finish on theirs.
    Activate {
        /// The agent's id, as Sent knows it (agent_…).
        #[arg(value_name = "AGENT", value_parser = agent_id)]
        agent: String,
        /// The version number (see `voicehost agents show AGENT`).
        #[arg(value_parser = clap::value_parser!(u32).range(1..))]
        version: u32,
    },
    /// Activate the version that was active before the current one.
    Rollback {
        /// The agent's id, as Sent knows it (agent_…).
        #[arg(value_name = "AGENT", value_parser = agent_id)]
        agent: String,
    },
    /// Delete one version (not the active one), or without --version the whole agent: its connections to
    /// Sent close and its live calls go to Sent's fallback.
    Delete {
        /// The agent's id, as Sent knows it (agent_…).
        #[arg(value_name = "AGENT", value_parser = agent_id)]
        agent: String,
        /// Delete only this version.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        version: Option<u32>,
    },
    /// What happens to a call its agent cannot serve (repeated traps, over a cap, no instance, behind Sent): `hangup`, or `transfer:KIND:VALUE` (e.g.
    /// `transfer:number:+14155550100`).
    Policy {
        /// The agent's id, as Sent knows it (agent_…).
        #[arg(value_name = "AGENT", value_parser = agent_id)]
        agent: String,
        /// `hangup`, or `transfer:KIND:VALUE` where KIND is Sent's party kind (number, user, agent, …).
        #[arg(value_name = "hangup|transfer:KIND:VALUE")]
        policy: FailurePolicy,
    },
    /// The tenant's live calls.
    Sessions,
    /// What the tenant keeps on the host (versions, stored and compiled bytes) beside its quota.
    Usage,
}

/// Makes the admin tokens of tenants for the host's configuration, which keeps only their SHA-256.
#[derive(clap::Subcommand, Debug, PartialEq, Eq)]
pub enum TokenCommand {
    /// Read a token from standard input and print its SHA-256 in hex (the config's `token_sha256`).
    Hash,
    /// Make a fresh random token: prints the token, then the `token_sha256 = "…"` line for the config.
    New,
}

/// `voicehost agents …`: one request to the admin API, its answer as a table (or JSON with --json).
pub async fn run(args: AgentsArgs) -> Result<()> {
    let client = Client::new(
        &args.admin,
        read_token(args.token_file.as_deref())?,
        Duration::from_secs(args.timeout),
        args.ca_file.as_deref(),
    )?;
    let output = execute(&client, args.command, args.json).await?;
    print!("{output}");
    Ok(())
}

/// `voicehost token hash|new`.
pub fn token(command: TokenCommand) -> Result<()> {
    match command {
        TokenCommand::Hash => {
            let token = token_from_stdin()?;
            println!("{}", token_sha256(&token));
        }
        TokenCommand::New => {
            let token = new_token()?;
            println!("{token}");
            println!("token_sha256 = \"{}\"", token_sha256(&token));
            if std::io::stderr().is_terminal() {
                eprintln!(
                    "(the first line is the tenant's token, shown only now; the second goes in the \
                     tenant's entry of the config)"
                );
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Arguments

/// An agent id as the API takes it (the config's rule, [`crate::tenancy::valid_agent_id`]; safe in a
/// URL path as it is).
fn agent_id(text: &str) -> Result<String, String> {
    if valid_agent_id(text) {
        Ok(text.to_string())
    } else {
        Err(AGENT_ID_RULE.into())
    }
}

// ---------------------------------------------------------------------------------------------------
// Tokens

/// The tenant's admin token, from `file` or else VOICEHOST_TOKEN, trimmed. No error shows any of it.
fn read_token(file: Option<&Path>) -> Result<String> {
    let text = match file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the admin token from {}", path.display()))?,
        // Not `?` on the VarError: its message would show a value that is not Unicode.
        None => std::env::var("VOICEHOST_TOKEN")
            .map_err(|_| anyhow!("no admin token: set VOICEHOST_TOKEN or pass --token-file"))?,
    };
    let token = text.trim();
    let from = match file {
        Some(path) => path.display().to_string(),
        None => "VOICEHOST_TOKEN".into(),
    };
    if token.is_empty() {
        bail!("the admin token in {from} is empty");
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        bail!(
            "the admin token in {from} holds spaces or characters that cannot go in an HTTP header"
        );
    }
    Ok(token.to_string())
}

fn token_from_stdin() -> Result<String> {
    let stdin = std::io::stdin();
    let mut text = String::new();
    if stdin.is_terminal() {
        eprint!("token (then Enter): ");
        stdin.lock().read_line(&mut text)
    } else {
        stdin.lock().read_to_string(&mut text)
    }
    .context("cannot read the token from standard input")?;
    let token = text.trim();
    if token.is_empty() {
        bail!("no token on standard input");
    }
    if token.chars().any(char::is_whitespace) {
        bail!("standard input holds more than the token (spaces or several lines)");
    }
    if token.len() > crate::tenancy::MAX_TOKEN_BYTES {
        bail!(
            "a token of more than {} bytes is never accepted by the admin API",
            crate::tenancy::MAX_TOKEN_BYTES
        );
    }
    if token.chars().count() < MIN_TOKEN_CHARS {
        bail!(
            "a token of fewer than {MIN_TOKEN_CHARS} characters is too easy to guess (`voicehost token new` \
             makes one of 67)"
        );
    }
    Ok(token.to_string())
}

/// The shortest token `voicehost token hash` takes: 24 characters, over 128 bits of an alphanumeric
/// secret.
pub const MIN_TOKEN_CHARS: usize = 24;

/// `vh_` and 32 random bytes from the kernel, in hex.
fn new_token() -> Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .context("cannot read /dev/urandom")?;
    Ok(format!("vh_{}", crate::content::hex(&bytes)))
}

mod agent_tests;
mod call;
mod check;
mod client;
mod limits;
mod local;
mod mock_http;
mod new;
mod render;
mod transcript;
mod wav;

pub use agent_tests::{test, Tally, TestArgs};
pub use call::{call, CallArgs, Verdict};
pub use check::{check, CheckArgs, Refused};
use client::*;
pub use client::{Body, Client};
pub use limits::RunLimits;
pub use new::{new, refused_name, Lang, NewArgs};
pub use render::agents_table;
use render::*;
pub use transcript::init as init_call_log;

// ---------------------------------------------------------------------------------------------------
// The commands

async fn execute(client: &Client, command: AgentsCommand, json: bool) -> Result<String> {
    let output = match command {
        AgentsCommand::List => {
            let answer = client.json(Method::GET, "/v1/agents", Body::Empty).await?;
            render(client, "/v1/agents", answer, json, agents_table)?
        }
        AgentsCommand::Show { agent } => {
            let path = format!("/v1/agents/{agent}");
            let answer = client.json(Method::GET, &path, Body::Empty).await?;
            render(client, &path, answer, json, agent_text)?
        }
        AgentsCommand::Upload {
            agent,
            file,
            activate,
        } => {
            let wasm =
                std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let query = if activate { "?activate=true" } else { "" };
            let path = format!("/v1/agents/{agent}/versions{query}");
            let answer = client.json(Method::POST, &path, Body::Wasm(wasm)).await?;
            render(client, &path, answer, json, |version: &VersionView| {
                uploaded(&agent, version)
            })?
        }
        AgentsCommand::Activate { agent, version } => {
            let path = format!("/v1/agents/{agent}/activate");
            let body = Body::json(&ActivateRequest { version })?;
            let answer = client.json(Method::POST, &path, body).await?;
            render(client, &path, answer, json, activated)?
        }
        AgentsCommand::Rollback { agent } => {
            let path = format!("/v1/agents/{agent}/rollback");
            let answer = client.json(Method::POST, &path, Body::Empty).await?;
            render(client, &path, answer, json, activated)?
        }
        AgentsCommand::Delete { agent, version } => {
            let path = match version {
                Some(version) => format!("/v1/agents/{agent}/versions/{version}"),
                None => format!("/v1/agents/{agent}"),
            };
            // 204: no JSON to print, so --json prints nothing.
            client.send(Method::DELETE, &path, Body::Empty).await?;
            match (json, version) {
                (true, _) => String::new(),
                (false, Some(version)) => format!("{agent}: deleted version {version}\n"),
                (false, None) => format!(
                    "{agent}: deleted; its connections to Sent are closed and its live calls went to \
                     Sent's fallback\n"
                ),
            }
        }
        AgentsCommand::Policy { agent, policy } => {
            let path = format!("/v1/agents/{agent}/failure-policy");
            let answer = client
                .json(Method::PUT, &path, Body::json(&policy)?)
                .await?;
            render(client, &path, answer, json, |agent: &AgentView| {
                format!(
                    "{}: a call its agent cannot serve gets {}\n",
                    clean(&agent.agent_id),
                    policy_text(&agent.failure_policy)
                )
            })?
        }
        AgentsCommand::Sessions => {
            let answer = client
                .json(Method::GET, "/v1/sessions", Body::Empty)
                .await?;
            render(client, "/v1/sessions", answer, json, sessions_table)?
        }
        AgentsCommand::Usage => {
            let answer = client.json(Method::GET, "/v1/usage", Body::Empty).await?;
            render(client, "/v1/usage", answer, json, usage_table)?
        }
    };
    Ok(output)
}

/// The answer to `path`: with --json, the host's JSON as it came (not re-read as a view, so nothing a
/// newer host adds is dropped, and a script sees exactly what the API says); else read as the view `T`
/// and rendered as text.
fn render<T: DeserializeOwned>(
    client: &Client,
    path: &str,
    answer: Value,
    json: bool,
    text: impl FnOnce(&T) -> String,
) -> Result<String> {
    if json {
        return Ok(pretty(&answer));
    }
    Ok(text(&view(answer, &client.admin.url(path))?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use serde_json::json;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    /// The commands as main.rs declares them.
    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(clap::Subcommand)]
    enum Command {
        Agents(AgentsArgs),
        #[command(subcommand)]
        Token(TokenCommand),
    }

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        let args = std::iter::once("voicehost").chain(args.iter().copied());
        Cli::try_parse_from(args).map(|cli| cli.command)
    }

    fn agents(args: &[&str]) -> AgentsArgs {
        match parse(&[&["agents"][..], args].concat()) {
            Ok(Command::Agents(args)) => args,
            Ok(Command::Token(_)) => panic!("not agents"),
            Err(error) => panic!("{args:?}: {error}"),
        }
    }

    #[test]
    fn the_commands_are_well_formed() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }

    #[test]
    fn policy_arguments_parse_into_the_apis_body() {
        let args = agents(&["policy", "agent_abc123", "hangup"]);
        assert_eq!(
            args.command,
            AgentsCommand::Policy {
                agent: "agent_abc123".into(),
                policy: FailurePolicy::HangUp
            }
        );
        let args = agents(&["policy", "agent_1", "transfer:user:desk:one"]);
        let AgentsCommand::Policy { policy, .. } = args.command else {
            panic!("not policy");
        };
        assert_eq!(
            json!(policy),
            json!({"action": "transfer", "to": {"kind": "user", "value": "desk:one"}})
        );
        // What Sent's transfer tool cannot take is refused here, saying why.
        let error = parse(&[
            "agents",
            "policy",
            "agent_1",
            "transfer:sip:sip:desk@example.com",
        ])
        .err()
        .expect("refused")
        .to_string();
        assert!(error.contains("user, number or agent"), "{error}");
        for bad in [
            "",
            "hang-up",
            "transfer:number",
            "transfer::+1",
            "transfer:number:555",
        ] {
            assert!(
                parse(&["agents", "policy", "agent_1", bad]).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn agent_ids_versions_and_options_are_checked_when_parsing() {
        assert!(agent_id("agent_abc123").is_ok());
        assert!(agent_id(&format!("agent_{}", "a".repeat(58))).is_ok());
        for bad in [
            "",
            "agent/../x",
            "agent abc",
            "agent_with_underscores",
            "agént",
            &"a".repeat(65),
            "a?b",
        ] {
            assert!(agent_id(bad).is_err(), "{bad:?}");
            assert!(parse(&["agents", "show", bad]).is_err(), "{bad:?}");
        }
        assert!(parse(&["agents", "activate", "agent_1", "0"]).is_err());
        assert!(parse(&["agents", "activate", "agent_1", "two"]).is_err());
        assert!(parse(&["agents", "delete", "agent_1", "--version", "-1"]).is_err());
        assert!(parse(&["agents", "--timeout", "0", "list"]).is_err());
        assert!(parse(&["agents"]).is_err(), "a subcommand is required");

        let args = agents(&[
            "upload",
            "agent_1",
            "a.wasm",
            "--activate",
            "--json",
            "--admin",
            "http://10.0.0.2:8080",
        ]);
        assert!(args.json);
        assert_eq!(args.admin, "http://10.0.0.2:8080");
        assert_eq!(
            args.command,
            AgentsCommand::Upload {
                agent: "agent_1".into(),
                file: "a.wasm".into(),
                activate: true
            }
        );
        let args = agents(&[
            "--token-file",
            "/run/token",
            "delete",
            "agent_1",
            "--version",
            "2",
        ]);
        assert_eq!(args.token_file, Some(PathBuf::from("/run/token")));
        assert_eq!(
            args.command,
            AgentsCommand::Delete {
                agent: "agent_1".into(),
                version: Some(2)
            }
        );
        assert_eq!(args.timeout, 120);
        assert!(matches!(
            parse(&["token", "new"]),
            Ok(Command::Token(TokenCommand::New))
        ));
        assert!(matches!(
            parse(&["token", "hash"]),
            Ok(Command::Token(TokenCommand::Hash))
        ));
        assert!(parse(&["token", "--token-file", "x", "hash"]).is_err());
    }

    #[test]
    fn a_token_hashes_to_its_sha256_and_new_tokens_are_random() {
        assert_eq!(
            token_sha256("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let (one, two) = (new_token().unwrap(), new_token().unwrap());
        assert_ne!(one, two);
        assert!(one.starts_with("vh_"));
        assert_eq!(one.len(), 3 + 64);
        assert!(one[3..].bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn the_token_file_is_trimmed_and_never_shown_in_an_error() {
        let dir = std::env::temp_dir().join(format!("voicehost-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "  vh_s3cret\n").unwrap();
        assert_eq!(read_token(Some(&file)).unwrap(), "vh_s3cret");
        std::fs::write(&file, "vh_s3cret with-space\n").unwrap();
        let error = format!("{:#}", read_token(Some(&file)).unwrap_err());
        assert!(!error.contains("s3cret"), "{error}");
        std::fs::write(&file, "\n").unwrap();
        assert!(read_token(Some(&file)).is_err());
        let error = format!("{:#}", read_token(Some(&dir.join("absent"))).unwrap_err());
        assert!(error.contains("absent"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_cli_calls_only_what_the_api_describes() {
        let document = serde_json::to_value(crate::api::openapi()).unwrap();
        assert!(document["openapi"].as_str().unwrap().starts_with("3.1"));
        for (path, method) in [
            ("/v1/agents", "get"),
            ("/v1/agents/{agent_id}", "get"),
            ("/v1/agents/{agent_id}", "delete"),
            ("/v1/agents/{agent_id}/versions", "post"),
            ("/v1/agents/{agent_id}/versions/{version}", "delete"),
            ("/v1/agents/{agent_id}/activate", "post"),
            ("/v1/agents/{agent_id}/rollback", "post"),
            ("/v1/agents/{agent_id}/failure-policy", "put"),
            ("/v1/sessions", "get"),
        ] {
            assert!(
                document["paths"][path][method].is_object(),
                "{method} {path}"
            );
        }
    }

    /// A one-shot HTTP server on loopback: answers one request with `answer` and hands back the request.
    async fn one_answer(answer: String) -> (Client, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            loop {
                let read = socket.read(&mut buffer).await.unwrap();
                request.extend_from_slice(&buffer[..read]);
                let text = String::from_utf8_lossy(&request).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let length = text[..end]
                        .lines()
                        .find_map(|line| line.strip_prefix("content-length: "))
                        .map_or(0, |n| n.trim().parse::<usize>().unwrap());
                    if request.len() >= end + 4 + length {
                        break;
                    }
                }
                assert!(read > 0, "the client closed early");
            }
            socket.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&request).to_string()
        });
        (client(&format!("http://{address}")), server)
    }

    fn client(admin: &str) -> Client {
        Client {
            admin: AdminUrl::parse(admin).unwrap(),
            token: "vh_test".into(),
            timeout: Duration::from_secs(5),
            tls: None,
        }
    }

    #[tokio::test]
    async fn list_sends_the_token_and_renders_the_answer() {
        let (client, server) = one_answer(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 13\r\n\r\n{\"agents\":[]}"
                .into(),
        )
        .await;
        let output = execute(&client, AgentsCommand::List, false).await.unwrap();
        assert!(output.starts_with("no agents yet"), "{output}");
        let request = server.await.unwrap();
        assert!(
            request.starts_with("GET /v1/agents HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(
            request.contains("authorization: Bearer vh_test\r\n"),
            "{request}"
        );
        assert!(
            request.contains(&format!("host: {}\r\n", client.admin.authority)),
            "{request}"
        );
    }

    #[tokio::test]
    async fn upload_posts_the_component_and_an_api_error_reads_well() {
        let body = r#"{"error":{"code":"core_module","message":"a core module, not a component"}}"#;
        let (client, server) = one_answer(format!(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ))
        .await;
        let file = std::env::temp_dir().join(format!("voicehost-cli-{}.wasm", std::process::id()));
        std::fs::write(&file, b"\0asm\x01\0\0\0").unwrap();
        let command = AgentsCommand::Upload {
            agent: "agent_1".into(),
            file: file.clone(),
            activate: true,
        };
        let error = execute(&client, command, false).await.unwrap_err();
        std::fs::remove_file(&file).unwrap();
        assert_eq!(
            format!("{error:#}"),
            "a core module, not a component (core_module, HTTP 400)"
        );
        let request = server.await.unwrap();
        assert!(
            request.starts_with("POST /v1/agents/agent_1/versions?activate=true HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(
            request.contains("content-type: application/wasm\r\n"),
            "{request}"
        );
        assert!(request.ends_with("\r\n\r\n\0asm\x01\0\0\0"), "{request:?}");
    }

    #[tokio::test]
    async fn a_malformed_answer_fails_the_command_but_json_prints_it() {
        let body = r#"{"sessions":[{"session_id":"vs_1","media":"video"}]}"#;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let (client, server) = one_answer(answer.clone()).await;
        let error = execute(&client, AgentsCommand::Sessions, false)
            .await
            .unwrap_err()
            .to_string();
        server.await.unwrap();
        let url = client.admin.url("/v1/sessions");
        assert!(
            error.starts_with(&format!(
                "{url} answered with JSON this voicehost does not understand: "
            )),
            "{error}"
        );

        let (client, server) = one_answer(answer).await;
        let output = execute(&client, AgentsCommand::Sessions, true)
            .await
            .unwrap();
        server.await.unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&output).unwrap(),
            serde_json::from_str::<Value>(body).unwrap()
        );
    }

    #[tokio::test]
    async fn delete_of_a_version_and_its_204() {
        let (client, server) = one_answer("HTTP/1.1 204 No Content\r\n\r\n".into()).await;
        let command = AgentsCommand::Delete {
            agent: "agent_1".into(),
            version: Some(2),
        };
        let output = execute(&client, command, false).await.unwrap();
        assert_eq!(output, "agent_1: deleted version 2\n");
        let request = server.await.unwrap();
        assert!(request.starts_with("DELETE /v1/agents/agent_1/versions/2 HTTP/1.1\r\n"));
    }

    #[tokio::test]
    async fn a_refused_connection_names_the_url_and_a_silent_host_times_out() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        drop(listener);
        let error = execute(
            &client(&format!("http://{address}")),
            AgentsCommand::Sessions,
            false,
        )
        .await
        .unwrap_err();
        let error = format!("{error:#}");
        assert!(
            error.contains(&format!("http://{address}/v1/sessions")),
            "{error}"
        );
        assert!(!error.contains("vh_test"), "{error}");

        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = client(&format!("http://{}", silent.local_addr().unwrap()));
        client.timeout = Duration::from_millis(300);
        let error = execute(&client, AgentsCommand::List, false)
            .await
            .unwrap_err();
        assert!(
            error.to_string().starts_with("no answer from http://"),
            "{error}"
        );
    }
}
