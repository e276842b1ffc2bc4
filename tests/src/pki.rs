//! Certificates made at test time with rcgen: a CA, a server certificate for 127.0.0.1 and
//! localhost, and client certificates (valid, expired, from another CA), as PEM files in a
//! directory of the test's own.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// A certificate authority that signs server and client certificates.
pub struct Ca {
    cert: Certificate,
    key: KeyPair,
    /// Its certificate, PEM.
    pub pem: String,
}

/// A certificate and its key, written as `NAME.pem` and `NAME.key`.
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let pem = cert.pem();
        Self { cert, key, pem }
    }

    /// Writes the CA certificate to `dir/NAME.pem`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(format!("{name}.pem"));
        std::fs::write(&path, &self.pem).unwrap();
        path
    }

    /// A server certificate for 127.0.0.1 and localhost.
    pub fn server(&self, dir: &Path, name: &str) -> Pair {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.subject_alt_names = vec![
            SanType::DnsName("localhost".try_into().unwrap()),
            SanType::IpAddress("127.0.0.1".parse().unwrap()),
        ];
        params
            .distinguished_name
            .push(DnType::CommonName, "txoutboxd");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params, dir, name)
    }

    /// A client certificate whose subject common name is `common_name`.
    pub fn client(&self, dir: &Path, name: &str, common_name: &str) -> Pair {
        self.issue(client_params(common_name), dir, name)
    }

    /// A client certificate with this serial number, which a revocation list names.
    pub fn client_with_serial(
        &self,
        dir: &Path,
        name: &str,
        common_name: &str,
        serial: u64,
    ) -> Pair {
        let mut params = client_params(common_name);
        params.serial_number = Some(serial.into());
        self.issue(params, dir, name)
    }

    /// Writes `dir/NAME.pem`: this CA's revocation list of the certificates with these
    /// serial numbers, valid from 2024 to 2099.
    pub fn crl(&self, dir: &Path, name: &str, revoked: &[u64]) -> PathBuf {
        let params = rcgen::CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2024, 1, 1),
            next_update: rcgen::date_time_ymd(2099, 1, 1),
            crl_number: rcgen::SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|serial| rcgen::RevokedCertParams {
                    serial_number: (*serial).into(),
                    revocation_time: rcgen::date_time_ymd(2024, 1, 1),
                    reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        };
        let crl = params.signed_by(&self.cert, &self.key).unwrap();
        let path = dir.join(format!("{name}.pem"));
        std::fs::write(&path, crl.pem().unwrap()).unwrap();
        path
    }

    /// A client certificate that ran out in 2021.
    pub fn expired_client(&self, dir: &Path, name: &str, common_name: &str) -> Pair {
        let mut params = client_params(common_name);
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        self.issue(params, dir, name)
    }

    fn issue(&self, params: CertificateParams, dir: &Path, name: &str) -> Pair {
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let pair = Pair {
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
        };
        std::fs::write(&pair.cert, cert.pem()).unwrap();
        std::fs::write(&pair.key, key.serialize_pem()).unwrap();
        pair
    }
}

fn client_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params
}

/// The files of a TLS server in a directory of the test's own: `ca.pem` and the server's
/// `server.pem` / `server.key` it signed, with the `[server.tls]` table naming them.
pub struct TlsFiles {
    pub dir: tempfile::TempDir,
    pub ca: Ca,
}

impl TlsFiles {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("txoutbox test CA");
        ca.write(dir.path(), "ca");
        ca.server(dir.path(), "server");
        Self { dir, ca }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `[server.tls]` with these files, reloaded every 200 ms; `mutual` trusts `ca.pem`
    /// for client certificates too.
    pub fn config(&self, mutual: bool) -> String {
        let mut tls = format!(
            "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\nreload_interval = \"200ms\"\n",
            self.path("server.pem").display(),
            self.path("server.key").display()
        );
        if mutual {
            tls.push_str(&format!(
                "client_ca = \"{}\"\n",
                self.path("ca.pem").display()
            ));
        }
        tls
    }
}

impl Default for TlsFiles {
    fn default() -> Self {
        Self::new()
    }
}

/// `[server.auth.identities.NAME]` with the SHA-256 of `token` and `grants`, a TOML
/// inline table such as `{ orders = ["subscribe"] }`.
pub fn token_identity(name: &str, token: &str, grants: &str) -> String {
    use sha2::{Digest, Sha256};
    let hash: String = Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("\n[server.auth.identities.{name}]\ntoken_sha256 = \"{hash}\"\ngrants = {grants}\n")
}
