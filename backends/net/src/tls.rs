//! TLS settings: the CA that signs the servers' certificates and, for mutual TLS, the client's
//! certificate and key, in PEM.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use fencelock::{Error, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

/// How a backend connects with TLS: the certificate authority to trust (PEM), optionally a
/// client certificate and key (PEM) for mutual TLS, and optionally the name to verify the
/// servers' certificates against (by default the host of each endpoint, which must appear in
/// the server certificate's subject alternative names: an IP address SAN for an address).
///
/// The PEM is parsed when it is given, so a bad file is an [`Error::InvalidConfig`] at once.
///
/// ```no_run
/// # fn f() -> fencelock::Result<()> {
/// use fencelock_net::TlsConfig;
/// let tls = TlsConfig::from_ca_file("/etc/etcd/ca.pem")?          // or from_ca_pem(text)
///     .with_identity_files("/etc/etcd/client.pem", "/etc/etcd/client.key")?; // mutual TLS
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct TlsConfig {
    ca_pem: String,
    identity: Option<(String, String)>,
    server_name: Option<String>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("ca", &format_args!("{} bytes of PEM", self.ca_pem.len()))
            .field("client_identity", &self.identity.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// The largest PEM file read: certificate chains and CA bundles are tens of KiB (Mozilla's
/// whole bundle is about 220 KiB).
const MAX_PEM_FILE: u64 = 4 << 20;

/// Reads a PEM file, bounded: a device given for it (`/dev/zero`) filled the memory. A pipe
/// is read, as from a shell's `<(…)`, whose writer has it open already; a named one that no
/// process has opened for writing reads as empty (opened plainly, it blocked the caller, a
/// connect, for ever).
fn read(path: &Path, what: &str) -> Result<String> {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let bad = |why: String| Error::invalid_config(path.display().to_string(), why);
    let cannot = |e: std::io::Error| bad(format!("cannot read the {what}: {e}"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(cannot)?;
    // Blocking again for the read: a writer that has the pipe open is waited for; a pipe with
    // no writer reads as its end.
    fcntl_getfl(&file)
        .and_then(|flags| fcntl_setfl(&file, flags - OFlags::NONBLOCK))
        .map_err(|e| cannot(e.into()))?;
    let mut text = String::new();
    file.take(MAX_PEM_FILE + 1)
        .read_to_string(&mut text)
        .map_err(cannot)?;
    if text.len() as u64 > MAX_PEM_FILE {
        return Err(bad(format!(
            "the {what} is larger than {} MiB: not a PEM file",
            MAX_PEM_FILE >> 20
        )));
    }
    Ok(text)
}

impl TlsConfig {
    /// Trusts the certificate authorities in `ca_pem` (one or more PEM certificates).
    pub fn from_ca_pem(ca_pem: impl Into<String>) -> Result<Self> {
        let ca_pem = ca_pem.into();
        let n = CertificateDer::pem_slice_iter(ca_pem.as_bytes())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::invalid_config("CA", format!("not valid PEM certificates: {e}")))?
            .len();
        if n == 0 {
            return Err(Error::invalid_config("CA", "no certificate in the PEM"));
        }
        let tls = TlsConfig {
            ca_pem,
            identity: None,
            server_name: None,
        };
        // Well-formed PEM may still hold no certificate a client can use (a garbage body):
        // parsed now, so that it is a bad setting here rather than a failed handshake later.
        tls.client_config()?;
        Ok(tls)
    }

    /// Trusts the certificate authorities in the PEM file at `path`.
    pub fn from_ca_file(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_ca_pem(read(path.as_ref(), "CA file")?)
    }

    /// Presents the client certificate (chain) `cert_pem` with its private key `key_pem`
    /// (PKCS#8, PKCS#1 or SEC1) for mutual TLS.
    pub fn with_identity_pem(
        mut self,
        cert_pem: impl Into<String>,
        key_pem: impl Into<String>,
    ) -> Result<Self> {
        let (cert_pem, key_pem) = (cert_pem.into(), key_pem.into());
        let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| {
                Error::invalid_config("client certificate", format!("not valid PEM: {e}"))
            })?;
        if certs.is_empty() {
            return Err(Error::invalid_config(
                "client certificate",
                "no certificate in the PEM",
            ));
        }
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| {
            Error::invalid_config(
                "client key",
                format!("no usable private key in the PEM: {e}"),
            )
        })?;
        self.identity = Some((cert_pem, key_pem));
        // The key itself parsed (and matched with the certificate), as the CA above.
        self.client_config()?;
        Ok(self)
    }

    /// Presents the client certificate and key in the PEM files at `cert` and `key`.
    pub fn with_identity_files(
        self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self> {
        let cert_pem = read(cert.as_ref(), "client certificate")?;
        let key_pem = read(key.as_ref(), "client key")?;
        self.with_identity_pem(cert_pem, key_pem)
    }

    /// Verifies the servers' certificates against `name` instead of each endpoint's host.
    pub fn with_server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// The CA certificates, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The client certificate and key, PEM, if mutual TLS is configured.
    pub fn identity_pem(&self) -> Option<(&str, &str)> {
        self.identity
            .as_ref()
            .map(|(c, k)| (c.as_str(), k.as_str()))
    }

    /// The name the servers' certificates are verified against, if set.
    pub fn server_name(&self) -> Option<&str> {
        self.server_name.as_deref()
    }

    /// A rustls client configuration with these settings (for probing).
    pub(crate) fn client_config(&self) -> Result<ClientConfig> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            let cert = cert.map_err(|e| Error::invalid_config("CA", e.to_string()))?;
            roots.add(cert).map_err(|e| {
                Error::invalid_config("CA", format!("unusable CA certificate: {e}"))
            })?;
        }
        let builder = ClientConfig::builder_with_provider(crate::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::invalid_config("TLS", e.to_string()))?
            .with_root_certificates(roots);
        match &self.identity {
            None => Ok(builder.with_no_client_auth()),
            Some((cert, key)) => {
                let certs = CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| Error::invalid_config("client certificate", e.to_string()))?;
                let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
                    .map_err(|e| Error::invalid_config("client key", e.to_string()))?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(identity_refused)
            }
        }
    }
}

/// A configuration that completes a handshake with any server (for telling a TLS port from a
/// plaintext one; nothing is ever sent over it).
pub(crate) fn any_server_config() -> ClientConfig {
    ClientConfig::builder_with_provider(crate::provider())
        .with_safe_default_protocol_versions()
        .expect("the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny))
        .with_no_client_auth()
}

/// Why rustls refused a client certificate and key, said of the part at fault: the key is
/// parsed only here (PEM that holds junk), and rustls said "unexpected error" of it.
fn identity_refused(e: rustls::Error) -> Error {
    match e {
        rustls::Error::InconsistentKeys(_) => Error::invalid_config(
            "client key",
            "the key does not belong to the client certificate",
        ),
        rustls::Error::General(why) => {
            Error::invalid_config("client key", format!("not a usable private key: {why}"))
        }
        e => Error::invalid_config("client certificate", e.to_string()),
    }
}

/// Accepts every certificate: used only to learn whether a port speaks TLS.
#[derive(Debug)]
struct AcceptAny;

impl rustls::client::danger::ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        crate::provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(r: Result<TlsConfig>) -> String {
        match r {
            Err(Error::InvalidConfig(e)) => e.to_string(),
            other => panic!("not InvalidConfig: {other:?}"),
        }
    }

    /// A self-signed certificate and its key, PEM.
    fn self_signed() -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A device, a directory or a huge file given as a PEM file is refused, without reading it
    /// whole (`/dev/zero` never ended).
    #[test]
    fn only_files_of_a_sane_size_are_read() {
        for path in ["/dev/zero", "/tmp", "/no/such/file"] {
            let e = invalid(TlsConfig::from_ca_file(path));
            assert!(e.contains(path), "{e}");
        }
        let dir = std::env::temp_dir().join(format!("fencelock-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.pem");
        std::fs::write(&big, vec![b'A'; (MAX_PEM_FILE + 1) as usize]).unwrap();
        let e = invalid(TlsConfig::from_ca_file(&big));
        assert!(e.contains("larger"), "{e}");
        // A named pipe nobody writes to: refused at once (it blocked for ever).
        let fifo = dir.join("ca.fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(TlsConfig::from_ca_file(&fifo).map(|_| ()));
        });
        let r = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("a pipe nobody writes to is read without waiting");
        assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// PEM that frames no usable certificate or key is refused when given, not at the
    /// handshake (where it read as the server refusing the client).
    #[test]
    fn garbage_inside_well_formed_pem_is_refused_at_once() {
        let garbage =
            |label: &str| format!("-----BEGIN {label}-----\nAAAA\n-----END {label}-----\n");
        invalid(TlsConfig::from_ca_pem("not a certificate"));
        invalid(TlsConfig::from_ca_pem(garbage("CERTIFICATE")));
        let (cert, key) = self_signed();
        let ca = TlsConfig::from_ca_pem(cert.clone()).unwrap();
        assert!(ca.clone().with_identity_pem(&*cert, &*key).is_ok());
        // Each said of the part at fault, in words (black-box round 18: a junk key was "client
        // certificate: unexpected error", another certificate's key "KeyMismatch").
        let e = invalid(ca.clone().with_identity_pem(&*cert, garbage("PRIVATE KEY")));
        assert!(e.contains("client key") && !e.contains("unexpected"), "{e}");
        let e = invalid(ca.clone().with_identity_pem(garbage("CERTIFICATE"), &*key));
        assert!(e.contains("client certificate"), "{e}");
        let (_, other_key) = self_signed();
        let e = invalid(ca.with_identity_pem(&*cert, &*other_key));
        assert!(
            e.contains("does not belong to the client certificate"),
            "{e}"
        );
    }
}
