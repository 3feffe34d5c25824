//! The admin API's listener, hardened against hostile clients: a cap on connections in all and per client
//! address (an IPv6 client by its /64; one more is closed at once, so the admin side runs out before the
//! calls' descriptors do), a deadline for a request's head (a client that sends half a request line, or
//! sits idle between requests, is closed), a most a connection may live (a client that stops reading
//! its answers cannot hold its place for ever), TLS when the config gives a certificate (its handshake
//! under the head deadline too), and a graceful stop. Built from hyper's HTTP/1 server, hyper-util's glue
//! and tokio-rustls; the router is axum's.

use crate::tenancy::AdminConfig;
use crate::tls::ServerCert;
use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// What the admin listener allows its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Connections open at once, from everyone.
    pub connections: usize,
    /// Connections open at once from one client address.
    pub per_client: usize,
    /// How long a request's head (request line and headers) may take to arrive, counted from when the
    /// connection is ready for one: also how long a connection may sit idle between requests.
    pub head_timeout: Duration,
    /// How long a connection may stay open at all, whatever it does.
    pub max_age: Duration,
    /// TLS handshakes begun per second, from everyone (in bursts of as many): each costs a signature on
    /// the workers that carry the calls, so connections past it are closed at once. One client address
    /// may begin a tenth of them ([`per_client_handshakes`]): one that connects and resets cannot take
    /// them all.
    pub handshakes_per_second: u32,
}

/// TLS handshakes one client address may begin per second: a tenth of the listener's, at least one.
pub fn per_client_handshakes(handshakes_per_second: u32) -> u32 {
    (handshakes_per_second / 10).max(1)
}

/// Client addresses the per-client handshake budget remembers at most; past it, stale ones are forgotten,
/// and while it is still full every TLS connection is closed at once (the limiter cannot say whether an
/// address is one it knows).
const MAX_HANDSHAKE_CLIENTS: usize = 10_000;

/// The config's `[admin]` settings (defaults: 256 connections, a quarter of a usual 1,024-descriptor limit,
/// which `serve` raises to its hard limit at start; 32 per client address; 10 s for a request's head).
impl From<&AdminConfig> for ListenerLimits {
    fn from(admin: &AdminConfig) -> ListenerLimits {
        ListenerLimits {
            connections: admin.max_connections,
            per_client: admin.max_connections_per_client,
            head_timeout: Duration::from_secs(admin.head_timeout_seconds),
            max_age: Duration::from_secs(admin.connection_max_seconds),
            handshakes_per_second: admin.tls_handshakes_per_second,
        }
    }
}

/// Serves `router` on `listener` under `limits`, in TLS with `tls`'s certificate when given, until `stop`
/// resolves, then lets the requests in progress finish (the caller bounds how long it waits). A connection
/// from a client `turned_away` says is to wait (its address failed to log in too often) is closed at once;
/// every connection closed at once is told to `refused`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ListenerLimits,
    tls: Option<Arc<ServerCert>>,
    turned_away: impl Fn(IpAddr) -> bool,
    refused: impl Fn() + Send + Sync + 'static,
    stop: impl Future<Output = ()>,
) {
    let tls = tls.map(|cert| cert.acceptor());
    let per_second = |n: u32| {
        governor::Quota::per_second(std::num::NonZeroU32::new(n.max(1)).expect("not zero"))
    };
    let handshakes =
        governor::DefaultDirectRateLimiter::direct(per_second(limits.handshakes_per_second));
    let client_handshakes = governor::DefaultKeyedRateLimiter::<IpAddr>::keyed(per_second(
        per_client_handshakes(limits.handshakes_per_second),
    ));
    let open = Arc::new(Semaphore::new(limits.connections));
    let clients = Arc::new(Clients::default());
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.head_timeout);
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors, most likely: wait for some to close rather than spin.
                    tracing::warn!(%error, "the admin listener cannot accept");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = open.clone().try_acquire_owned() else {
            refused();
            tracing::debug!(%peer, "admin connection refused: the listener is full");
            continue;
        };
        let key = client_key(peer.ip());
        if turned_away(key) {
            refused();
            tracing::debug!(%peer, "admin connection refused: the client failed to log in too often");
            continue;
        }
        let Some(client) = clients.enter(key, limits.per_client) else {
            refused();
            tracing::debug!(%peer, "admin connection refused: the client has too many open");
            continue;
        };
        if tls.is_some() {
            if client_handshakes.len() >= MAX_HANDSHAKE_CLIENTS {
                client_handshakes.retain_recent();
            }
            // The client's own budget first: a client past it spends nothing of everyone's.
            let known = client_handshakes.len() < MAX_HANDSHAKE_CLIENTS;
            if !known || client_handshakes.check_key(&key).is_err() || handshakes.check().is_err() {
                refused();
                tracing::debug!(%peer, "admin connection refused: too many TLS handshakes this second");
                continue;
            }
        }
        let service = router.clone().layer(axum::Extension(ConnectInfo(peer)));
        let service = TowerToHyperService::new(service);
        let (http, watcher, tls) = (http.clone(), graceful.watcher(), tls.clone());
        let (head_timeout, max_age) = (limits.head_timeout, limits.max_age);
        tokio::spawn(async move {
            let _held = (slot, client);
            let served = async {
                match tls {
                    None => {
                        let connection = http.serve_connection(TokioIo::new(stream), service);
                        watcher.watch(connection).await
                    }
                    Some(tls) => {
                        // A client that opens TLS and stalls is closed like one that stalls in a head.
                        let stream =
                            match tokio::time::timeout(head_timeout, tls.accept(stream)).await {
                                Ok(Ok(stream)) => stream,
                                Ok(Err(error)) => {
                                    tracing::debug!(%peer, %error, "admin TLS handshake failed");
                                    return Ok(());
                                }
                                Err(_) => {
                                    tracing::debug!(%peer, "admin TLS handshake timed out");
                                    return Ok(());
                                }
                            };
                        let connection = http.serve_connection(TokioIo::new(stream), service);
                        watcher.watch(connection).await
                    }
                }
            };
            match tokio::time::timeout(max_age, served).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::debug!(%peer, %error, "admin connection ended"),
                Err(_) => tracing::debug!(%peer, "admin connection closed: open too long"),
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Connections open per client address.
#[derive(Default)]
struct Clients(Mutex<HashMap<IpAddr, usize>>);

/// One connection of a client, counted until dropped.
struct Client {
    clients: Arc<Clients>,
    ip: IpAddr,
}

impl Clients {
    /// Counts one more connection from `ip`, unless it has `most` open.
    fn enter(self: &Arc<Self>, ip: IpAddr, most: usize) -> Option<Client> {
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= most {
            return None;
        }
        *count += 1;
        Some(Client {
            clients: self.clone(),
            ip,
        })
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let mut open = self.clients.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                // The map holds only clients with connections open: its size is bounded by the cap.
                open.remove(&self.ip);
            }
        }
    }
}

/// What counts as one client: its IPv4 address, or its IPv6 address's /64 (one host's usual share).
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

/// The client's address, when the request came through [`serve`].
pub fn client_of(request: &axum::http::request::Parts) -> Option<SocketAddr> {
    request
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| *addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_has_at_most_its_connections_and_a_closed_one_frees_its_place() {
        let clients = Arc::new(Clients::default());
        let ip: IpAddr = [127, 0, 0, 1].into();
        let first = clients.enter(ip, 2).unwrap();
        let _second = clients.enter(ip, 2).unwrap();
        assert!(clients.enter(ip, 2).is_none());
        assert!(clients.enter([127, 0, 0, 2].into(), 2).is_some());
        drop(first);
        assert!(clients.enter(ip, 2).is_some());
    }

    #[test]
    fn an_ipv6_client_is_its_slash_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(client_key(a), client_key(b));
        assert_ne!(client_key(a), client_key(c));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(client_key(mapped), IpAddr::from([10, 0, 0, 1]));
    }

    #[test]
    fn a_client_with_nothing_open_is_forgotten() {
        let clients = Arc::new(Clients::default());
        drop(clients.enter([10, 0, 0, 1].into(), 1).unwrap());
        assert!(clients.0.lock().unwrap().is_empty());
    }
}
