//! TLS, one place for it (rustls with ring's cryptography): the admin API's server side, with a certificate
//! that can be swapped while serving ([`ServerCert`], reloaded on SIGHUP), and the client side of agents'
//! HTTPS requests and of `voicehost agents` ([`client`]).

use anyhow::{anyhow, bail, Context, Result};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// The largest certificate chain or key file read, in bytes: far more than any real one.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// ring's provider: the one cryptography of the process (wasmtime-wasi-http and tokio-tungstenite use it
/// too), named explicitly so no process-wide default has to be installed.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Where the admin API's certificate chain and private key are: PEM files, read at start and on SIGHUP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    /// The certificate chain, the server's own first.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl CertFiles {
    /// The chain and key, read and checked to belong together.
    fn load(&self) -> Result<CertifiedKey> {
        let chain = read_pem(&self.cert)?;
        let chain = CertificateDer::pem_slice_iter(&chain)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow!("{}: not a PEM certificate chain: {e}", self.cert.display()))?;
        if chain.is_empty() {
            bail!("{}: holds no certificate", self.cert.display());
        }
        let key = read_pem(&self.key)?;
        // Never the key's text in an error: only its file's name.
        let key = PrivateKeyDer::from_pem_slice(&key)
            .map_err(|_| anyhow!("{}: holds no PEM private key", self.key.display()))?;
        let key = CertifiedKey::from_der(chain, key, &provider()).with_context(|| {
            format!(
                "{} and {} do not make a certificate and its key",
                self.cert.display(),
                self.key.display()
            )
        })?;
        Ok(key)
    }
}

fn read_pem(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        bail!("{}: over {MAX_PEM_BYTES} bytes", path.display());
    }
    Ok(bytes)
}

/// The admin API's certificate, swappable while connections are served: each new handshake takes the
/// current one.
#[derive(Debug)]
pub struct ServerCert {
    files: RwLock<CertFiles>,
    current: RwLock<Arc<CertifiedKey>>,
}

impl ServerCert {
    /// The certificate in `files`, or why it cannot be served.
    pub fn load(files: CertFiles) -> Result<Arc<ServerCert>> {
        let key = files.load()?;
        Ok(Arc::new(ServerCert {
            files: RwLock::new(files),
            current: RwLock::new(Arc::new(key)),
        }))
    }

    /// Reads `files` again and serves what they hold from the next handshake on; on an error, keeps the
    /// certificate it has.
    pub fn reload(&self, files: CertFiles) -> Result<()> {
        let key = files.load()?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(key);
        *self.files.write().unwrap_or_else(|p| p.into_inner()) = files;
        Ok(())
    }

    /// The files the certificate came from.
    pub fn files(&self) -> CertFiles {
        self.files.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A TLS acceptor serving this certificate (TLS 1.2 and 1.3; HTTP/1.1 offered by ALPN).
    pub fn acceptor(self: &Arc<Self>) -> tokio_rustls::TlsAcceptor {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("ring's provider supports TLS 1.2 and 1.3")
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }
}

impl ResolvesServerCert for ServerCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

/// A TLS client that trusts the web's root certificates (webpki-roots) and, when given, the PEM
/// certificates in `extra` (a private CA, or a self-signed admin certificate).
pub fn client(extra: Option<&Path>) -> Result<tokio_rustls::TlsConnector> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.into(),
    };
    if let Some(path) = extra {
        let pem = read_pem(path)?;
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert =
                cert.map_err(|e| anyhow!("{}: not a PEM certificate: {e}", path.display()))?;
            roots
                .add(cert)
                .with_context(|| format!("{}: not a usable CA certificate", path.display()))?;
            added += 1;
        }
        if added == 0 {
            bail!("{}: holds no certificate", path.display());
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring's provider supports TLS 1.2 and 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory with a self-signed certificate for `localhost` (cert.pem) and its key (key.pem).
    fn certificate(name: &str) -> (PathBuf, CertFiles) {
        let dir = std::env::temp_dir().join(format!("voicehost-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        std::fs::write(dir.join("cert.pem"), made.cert.pem()).unwrap();
        std::fs::write(dir.join("key.pem"), made.signing_key.serialize_pem()).unwrap();
        let files = CertFiles {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        };
        (dir, files)
    }

    #[test]
    fn a_certificate_loads_with_its_own_key_and_not_with_another() {
        let (dir, files) = certificate("pair");
        assert!(ServerCert::load(files.clone()).is_ok());
        let (other, theirs) = certificate("other");
        let mismatched = CertFiles {
            key: theirs.key,
            ..files.clone()
        };
        let error = format!("{:#}", ServerCert::load(mismatched).unwrap_err());
        assert!(
            error.contains("do not make a certificate and its key"),
            "{error}"
        );
        std::fs::write(
            &files.key,
            "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let error = format!("{:#}", ServerCert::load(files.clone()).unwrap_err());
        assert!(
            !error.contains("c2VjcmV0"),
            "the error shows the key: {error}"
        );
        std::fs::write(&files.cert, "").unwrap();
        let error = format!("{:#}", ServerCert::load(files).unwrap_err());
        assert!(error.contains("holds no certificate"), "{error}");
        let _ = std::fs::remove_dir_all(dir);
        let _ = std::fs::remove_dir_all(other);
    }

    #[test]
    fn a_reload_that_fails_keeps_the_certificate_served() {
        let (dir, files) = certificate("reload");
        let cert = ServerCert::load(files.clone()).unwrap();
        let served = cert.current.read().unwrap().clone();
        let missing = CertFiles {
            key: dir.join("missing.pem"),
            ..files.clone()
        };
        assert!(cert.reload(missing).is_err());
        assert!(Arc::ptr_eq(&served, &cert.current.read().unwrap()));
        assert_eq!(cert.files(), files);
        let (other, theirs) = certificate("reload-new");
        cert.reload(theirs.clone()).unwrap();
        assert!(!Arc::ptr_eq(&served, &cert.current.read().unwrap()));
        assert_eq!(cert.files(), theirs);
        let _ = std::fs::remove_dir_all(dir);
        let _ = std::fs::remove_dir_all(other);
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused() {
        let (dir, files) = certificate("ca");
        assert!(client(Some(&files.cert)).is_ok());
        let error = client(Some(&files.key)).err().unwrap().to_string();
        assert!(error.contains("holds no certificate"), "{error}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
