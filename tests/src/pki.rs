//! Certificates generated at test time (`rcgen`), for servers that serve TLS only and for the
//! clients that talk to them: a test CA with a server certificate (SANs `localhost` and
//! `127.0.0.1`) and a client certificate, and a second, "rogue" CA with a client certificate of
//! its own, for the tests of what a wrong setting gives.

use std::path::{Path, PathBuf};

use fencelock_net::TlsConfig;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// One test PKI, its files in a temporary directory (removed on drop).
#[derive(Debug)]
pub struct TestPki {
    dir: tempfile::TempDir,
}

/// The PEM files of one party.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The certificate.
    pub cert: PathBuf,
    /// The private key (PKCS#8).
    pub key: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA")
}

fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    cn: &str,
    server: bool,
    dir: &Path,
    name: &str,
) -> Identity {
    let sans = if server {
        vec!["localhost".to_string()]
    } else {
        Vec::new()
    };
    let mut params = CertificateParams::new(sans).expect("leaf params");
    if server {
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
    }
    params.distinguished_name.push(DnType::CommonName, cn);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = if server {
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ]
    } else {
        vec![ExtendedKeyUsagePurpose::ClientAuth]
    };
    let key = KeyPair::generate().expect("leaf key");
    let cert = params.signed_by(&key, issuer).expect("leaf certificate");
    let id = Identity {
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}.key")),
    };
    std::fs::write(&id.cert, cert.pem()).expect("write certificate");
    std::fs::write(&id.key, key.serialize_pem()).expect("write key");
    id
}

impl TestPki {
    /// Generates the CAs and certificates.
    pub fn generate() -> TestPki {
        let dir = tempfile::Builder::new()
            .prefix("fencelock-pki-")
            .tempdir()
            .expect("temp dir");
        let good = ca("fencelock test CA");
        let rogue = ca("rogue CA");
        std::fs::write(dir.path().join("ca.pem"), good.pem()).expect("write CA");
        std::fs::write(dir.path().join("rogue-ca.pem"), rogue.pem()).expect("write rogue CA");
        let server = leaf(&good, "localhost", true, dir.path(), "server");
        leaf(&good, "client", false, dir.path(), "client");
        leaf(&rogue, "intruder", false, dir.path(), "rogue-client");
        // ZooKeeper reads its key store as one PEM file: the certificate, then the key.
        let keystore = format!(
            "{}{}",
            std::fs::read_to_string(&server.cert).expect("read"),
            std::fs::read_to_string(&server.key).expect("read")
        );
        std::fs::write(dir.path().join("server-keystore.pem"), keystore).expect("write keystore");
        TestPki { dir }
    }

    /// The test CA's certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Another CA's certificate (it signed neither the server nor the client).
    pub fn rogue_ca(&self) -> PathBuf {
        self.dir.path().join("rogue-ca.pem")
    }

    /// The server's certificate and key.
    pub fn server(&self) -> Identity {
        self.identity("server")
    }

    /// The server's certificate and key in one PEM file (ZooKeeper's key store).
    pub fn server_keystore(&self) -> PathBuf {
        self.dir.path().join("server-keystore.pem")
    }

    /// A client certificate signed by the test CA.
    pub fn client(&self) -> Identity {
        self.identity("client")
    }

    /// A client certificate signed by the rogue CA.
    pub fn rogue_client(&self) -> Identity {
        self.identity("rogue-client")
    }

    fn identity(&self, name: &str) -> Identity {
        Identity {
            cert: self.dir.path().join(format!("{name}.pem")),
            key: self.dir.path().join(format!("{name}.key")),
        }
    }

    /// Client TLS settings trusting the test CA, with the test client certificate.
    pub fn client_tls(&self) -> TlsConfig {
        let id = self.client();
        TlsConfig::from_ca_file(self.ca())
            .and_then(|t| t.with_identity_files(id.cert, id.key))
            .expect("client TLS settings")
    }
}
