//! Where an agent's HTTP request may connect: the addresses its host resolves to, checked after DNS.
//!
//! The allowlist ([`super::outbound::HttpPolicy`]) names origins; a name can resolve anywhere, so a name
//! that resolves to the host's own loopback, a private network or a cloud's metadata service would let an
//! agent reach what only the host should. [`connect`] resolves the name itself, keeps only the addresses
//! [`is_public`] passes, and connects to those: the address checked is the address connected to, so a
//! second lookup (DNS rebinding) cannot slip another one in. Two kinds of origin may reach any address,
//! because an operator wrote them so: one whose host is an IP literal (`http://10.0.0.5:8080` names its
//! address), and one also listed in `[tenants.http] allow_private`.
//!
//! Redirects are never followed by the host (`wasi:http` hands a 3xx to the guest); a guest that follows
//! one makes a new request, checked like the first.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs as _};
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use wasmtime_wasi_http::Error;

/// Name lookups in progress at once, over every agent. A lookup runs on a blocking thread that cannot be
/// stopped (getaddrinfo): its place is given back when the lookup returns, not when the request gives
/// up, so a slow resolver can fill these places but never the host's blocking threads.
pub const MAX_LOOKUPS: usize = 64;

/// Name lookups in progress at once for one tenant's agents: a tenant whose allowed names resolve slowly
/// waits for its own lookups, and takes at most this many of the host's [`MAX_LOOKUPS`].
pub const LOOKUPS_PER_TENANT: usize = 8;

static LOOKUPS: Semaphore = Semaphore::const_new(MAX_LOOKUPS);

/// One tenant's places for name lookups ([`LOOKUPS_PER_TENANT`]), shared by its agents' calls.
#[derive(Clone)]
pub struct Lookups(Arc<Semaphore>);

impl Default for Lookups {
    fn default() -> Lookups {
        Lookups(Arc::new(Semaphore::new(LOOKUPS_PER_TENANT)))
    }
}

impl std::fmt::Debug for Lookups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lookups({} free)", self.0.available_permits())
    }
}

/// Places, not a setting: two policies that allow the same are the same policy.
impl PartialEq for Lookups {
    fn eq(&self, _: &Lookups) -> bool {
        true
    }
}

impl Eq for Lookups {}

/// The addresses `host` resolves to, by the system's resolver, in one of the tenant's places and one of
/// the host's.
async fn lookup(places: &Lookups, host: &str, port: u16) -> Result<Vec<SocketAddr>, Error> {
    let dns_error = || Error::DnsError {
        rcode: None,
        info_code: None,
    };
    let own = places
        .0
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| dns_error())?;
    let place = LOOKUPS.acquire().await.map_err(|_| dns_error())?;
    let host = host.to_string();
    let resolved = tokio::task::spawn_blocking(move || {
        let _places = (own, place);
        (host.as_str(), port)
            .to_socket_addrs()
            .map(Iterator::collect)
    })
    .await;
    match resolved {
        Ok(Ok(addresses)) => Ok(addresses),
        _ => Err(dns_error()),
    }
}

/// Which addresses a request may connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Only addresses [`is_public`] passes.
    Public,
    /// Any address: the origin names an IP literal, or the operator allowed it private addresses.
    Any,
}

/// IPv4 ranges that are not the public internet (RFC 6890 and its successors): this network, private
/// networks, shared address space (carrier NAT; Alibaba's metadata service), loopback, Azure's host
/// endpoint (WireServer, 168.63.129.16: public, but the host's own), link-local (most clouds' metadata
/// service, 169.254.169.254), IETF protocol assignments, documentation, the 6to4 relay,
/// benchmarking, multicast, reserved and broadcast.
const IPV4_NOT_PUBLIC: &[(Ipv4Addr, u8)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8),
    (Ipv4Addr::new(10, 0, 0, 0), 8),
    (Ipv4Addr::new(100, 64, 0, 0), 10),
    (Ipv4Addr::new(127, 0, 0, 0), 8),
    (Ipv4Addr::new(168, 63, 129, 16), 32),
    (Ipv4Addr::new(169, 254, 0, 0), 16),
    (Ipv4Addr::new(172, 16, 0, 0), 12),
    (Ipv4Addr::new(192, 0, 0, 0), 24),
    (Ipv4Addr::new(192, 0, 2, 0), 24),
    (Ipv4Addr::new(192, 88, 99, 0), 24),
    (Ipv4Addr::new(192, 168, 0, 0), 16),
    (Ipv4Addr::new(198, 18, 0, 0), 15),
    (Ipv4Addr::new(198, 51, 100, 0), 24),
    (Ipv4Addr::new(203, 0, 113, 0), 24),
    (Ipv4Addr::new(224, 0, 0, 0), 4),
    (Ipv4Addr::new(240, 0, 0, 0), 4),
];

/// IPv6 ranges that are not the public internet: unspecified, loopback and IPv4-compatible (all in
/// `::/96`), the discard prefix, local-use NAT64, IETF protocol assignments (Teredo among them),
/// documentation (both), unique local (AWS's metadata service, fd00:ec2::254), deprecated site-local,
/// link-local and multicast. IPv4-mapped, NAT64 and 6to4 addresses are judged by the IPv4 address they
/// carry (see [`is_public`]).
const IPV6_NOT_PUBLIC: &[(Ipv6Addr, u8)] = &[
    (Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 0), 96),
    (Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64),
    (Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48),
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 23),
    (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32),
    (Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20),
    (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7),
    (Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10),
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10),
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8),
];

/// Whether `ip` is an address of the public internet, outside every range of [`IPV4_NOT_PUBLIC`] and
/// [`IPV6_NOT_PUBLIC`]. An IPv6 address that carries an IPv4 one (IPv4-mapped `::ffff:0:0/96`, NAT64
/// `64:ff9b::/96`, 6to4 `2002::/16`) is public only if that IPv4 address is.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            !IPV4_NOT_PUBLIC
                .iter()
                .any(|&(net, len)| bits >> (32 - len) == u32::from(net) >> (32 - len))
        }
        IpAddr::V6(v6) => {
            if let Some(carried) = carried_ipv4(v6) {
                return is_public(IpAddr::V4(carried));
            }
            let bits = u128::from(v6);
            !IPV6_NOT_PUBLIC
                .iter()
                .any(|&(net, len)| bits >> (128 - len) == u128::from(net) >> (128 - len))
        }
    }
}

/// The IPv4 address an IPv6 one carries, when it is IPv4-mapped, NAT64 (well-known prefix) or 6to4.
fn carried_ipv4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(low),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low),
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        )),
        _ => None,
    }
}

/// The IP address `host` names, if it is a literal (an IPv6 one in brackets, as in a URL).
pub fn literal(host: &str) -> Option<IpAddr> {
    match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
        None => host.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
    }
}

/// A TCP connection to `host:port` (`host` as in the request's URI), to an address `reach` permits,
/// by `deadline` for the lookup and the connection together. Every permitted address is tried in the
/// resolver's order. A name whose addresses are all refused fails with
/// `error-code::destination-IP-prohibited`, and `refused` is told (it logs with the host and port only).
pub async fn connect(
    host: &str,
    port: u16,
    reach: Reach,
    lookups: &Lookups,
    deadline: Instant,
    refused: impl FnOnce(),
) -> Result<TcpStream, Error> {
    let attempt = async {
        let addresses: Vec<SocketAddr> = match literal(host) {
            Some(ip) => vec![SocketAddr::new(ip, port)],
            None => lookup(lookups, host, port).await?,
        };
        if addresses.is_empty() {
            return Err(Error::DestinationNotFound);
        }
        let permitted: Vec<SocketAddr> = addresses
            .iter()
            .copied()
            .filter(|a| reach == Reach::Any || is_public(a.ip()))
            .collect();
        if permitted.is_empty() {
            refused();
            return Err(Error::DestinationIpProhibited);
        }
        let mut last = None;
        for address in permitted {
            match TcpStream::connect(address).await {
                Ok(stream) => return Ok(stream),
                Err(error) => last = Some(error),
            }
        }
        Err(last.map_or(Error::DestinationUnavailable, Error::Connect))
    };
    match tokio::time::timeout_at(deadline, attempt).await {
        Ok(result) => result,
        Err(_) => Err(Error::ConnectionTimeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_tenant_with_all_its_lookups_in_progress_waits_and_another_tenant_resolves() {
        let (slow, other) = (Lookups::default(), Lookups::default());
        // The slow tenant's lookups all hang (a resolver that does not answer).
        let _hung: Vec<_> = (0..LOOKUPS_PER_TENANT)
            .map(|_| slow.0.clone().try_acquire_owned().unwrap())
            .collect();
        let waits = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            lookup(&slow, "localhost", 80),
        )
        .await;
        assert!(
            waits.is_err(),
            "a ninth lookup of the slow tenant's went ahead"
        );
        let resolved = lookup(&other, "localhost", 80).await.unwrap();
        assert!(
            resolved.iter().all(|a| a.ip().is_loopback()),
            "{resolved:?}"
        );
    }

    fn public(text: &str) -> bool {
        is_public(text.parse().unwrap_or_else(|e| panic!("{text}: {e}")))
    }

    #[test]
    fn loopback_private_link_local_and_metadata_addresses_are_not_public() {
        for text in [
            "127.0.0.1",
            "127.255.0.9",
            "0.0.0.0",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "168.63.129.16",
            "100.100.100.200",
            "100.64.0.1",
            "192.0.0.192",
            "198.18.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::10.0.0.1",
            "64:ff9b:1::1",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            "2001::1",
            "2001:db8::1",
            "fd00:ec2::254",
            "fc00::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(!public(text), "{text} counted public");
        }
    }

    #[test]
    fn addresses_of_the_internet_are_public_including_ones_carried_in_ipv6() {
        for text in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.216.34",
            "172.15.255.255",
            "172.32.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "169.253.255.255",
            "192.0.1.1",
            "223.255.255.255",
            "2606:4700::1111",
            "2a00:1450:4001::1",
            "::ffff:8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:808:808::1",
        ] {
            assert!(public(text), "{text} counted not public");
        }
    }

    #[test]
    fn literals_are_read_as_in_a_url() {
        assert_eq!(literal("127.0.0.1"), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(literal("[::1]"), Some("::1".parse().unwrap()));
        assert_eq!(literal("::1"), None);
        assert_eq!(literal("localhost"), None);
        assert_eq!(literal("1.2.3.4.example"), None);
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_unless_any_address_is_allowed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let by = || Instant::now() + std::time::Duration::from_secs(5);
        let mut told = false;
        let refused = connect(
            "localhost",
            port,
            Reach::Public,
            &Lookups::default(),
            by(),
            || told = true,
        )
        .await;
        assert!(
            matches!(refused, Err(Error::DestinationIpProhibited)),
            "{refused:?}"
        );
        assert!(told);
        let reached = connect(
            "localhost",
            port,
            Reach::Any,
            &Lookups::default(),
            by(),
            || panic!("refused"),
        )
        .await;
        assert!(reached.is_ok(), "{reached:?}");
        let literal = connect(
            "127.0.0.1",
            port,
            Reach::Any,
            &Lookups::default(),
            by(),
            || panic!("refused"),
        )
        .await;
        assert!(literal.is_ok(), "{literal:?}");
    }
}
