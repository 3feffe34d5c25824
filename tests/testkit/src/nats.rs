//! A `nats-server -js` of the test's own on loopback (Debian's package, which the README's test command
//! installs), stopped when dropped; it can be killed and started again on the same port and store, as a
//! NATS outage and its end look to the hosts.

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One NATS server with JetStream.
pub struct Nats {
    child: Option<Child>,
    port: u16,
    store: PathBuf,
    /// A member of a cluster: its name, cluster port and the others' (`--routes`).
    cluster: Option<(String, u16, Vec<u16>)>,
}

impl Nats {
    /// A server on a free loopback port, its JetStream store in `store` (created).
    pub fn start(store: PathBuf) -> Nats {
        std::fs::create_dir_all(&store).unwrap();
        let mut nats = Nats {
            child: None,
            port: 0,
            store,
            cluster: None,
        };
        nats.run();
        nats
    }

    /// `size` servers forming one JetStream cluster on loopback, each with its store under `dir`. They
    /// take clients at once; JetStream answers once they have elected a leader (a few seconds).
    pub fn cluster(dir: PathBuf, size: usize) -> Vec<Nats> {
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let ports: Vec<(u16, u16)> = (0..size).map(|_| (free(), free())).collect();
        let routes: Vec<u16> = ports.iter().map(|(_, route)| *route).collect();
        ports
            .iter()
            .enumerate()
            .map(|(n, (port, route))| {
                let store = dir.join(format!("n{n}"));
                std::fs::create_dir_all(&store).unwrap();
                let others = routes.iter().copied().filter(|r| r != route).collect();
                let mut nats = Nats {
                    child: None,
                    port: *port,
                    store,
                    cluster: Some((format!("n{n}"), *route, others)),
                };
                nats.restart();
                nats
            })
            .collect()
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kills the server at once (no goodbye to its clients), as a crash or a cut cable does.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again, on the same port and store.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(20);
        // The port may be in TIME_WAIT for a moment; nats-server sets SO_REUSEADDR, so this is short.
        loop {
            self.run();
            if self.child.is_some() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not start again on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs nats-server (on `self.port`, or a free one when 0) and waits until it takes clients; leaves
    /// `child` empty if it exits first.
    fn run(&mut self) {
        let port = if self.port == 0 {
            "-1".to_string()
        } else {
            self.port.to_string()
        };
        let mut command = Command::new("nats-server");
        command
            .args(["-js", "-a", "127.0.0.1", "-p", &port, "-sd"])
            .arg(&self.store);
        if let Some((name, route, others)) = &self.cluster {
            let routes: Vec<String> = others
                .iter()
                .map(|port| format!("nats://127.0.0.1:{port}"))
                .collect();
            command
                .args([
                    "--name",
                    name,
                    "--server_name",
                    name,
                    "--cluster_name",
                    "voicehost",
                ])
                .args(["--cluster", &format!("nats://127.0.0.1:{route}")])
                .args(["--routes", &routes.join(",")]);
        }
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect(
                "nats-server runs: install it (apt-get install nats-server; scripts/test does)",
            );
        let stderr = child.stderr.take().unwrap();
        let (tell, told) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // "Listening for client connections on 127.0.0.1:4222"
                if let Some(at) = line.split("client connections on ").nth(1) {
                    let port = at.rsplit(':').next().and_then(|p| p.trim().parse().ok());
                    let _ = tell.send(port);
                }
                if line.contains("Server is ready") {
                    let _ = tell.send(None);
                }
            }
        });
        let mut port = None;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match told.recv_timeout(Duration::from_millis(100)) {
                Ok(Some(p)) => port = Some(p),
                Ok(None) if port.is_some() => break,
                Ok(None) => {}
                Err(_) => {
                    if child.try_wait().unwrap().is_some() {
                        return;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "nats-server never said it was ready"
                    );
                }
            }
        }
        self.port = port.unwrap();
        self.child = Some(child);
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}
