//! A certificate authority for the TLS tests (T17), made with rcgen: server certificates for
//! 127.0.0.1 and `localhost`, client certificates whose identity is a common name or a
//! subject alternative name. Every file is written beside its final name and renamed over it,
//! so that a daemon watching the files never reads half of one.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::path::{Path, PathBuf};

/// A certificate file and its private key's file, both PEM.
#[derive(Clone, Debug)]
pub struct Pair {
    pub certificate: PathBuf,
    pub key: PathBuf,
}

pub struct TestCa {
    certificate: rcgen::Certificate,
    key: KeyPair,
    directory: PathBuf,
    name: String,
    /// The CA's own certificate, PEM: what a client or the daemon trusts.
    pub file: PathBuf,
}

/// Writes `contents` to `path` by renaming a sibling over it.
pub fn write_replacing(path: &Path, contents: &[u8]) {
    let temporary = PathBuf::from(format!("{}.writing", path.display()));
    std::fs::write(&temporary, contents).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

fn distinguished_name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

impl TestCa {
    /// A new CA named `name`, its certificate written to `<directory>/<name>.pem`.
    pub fn new(directory: &Path, name: &str) -> TestCa {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(&format!("ringpost test CA {name}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let certificate = params.self_signed(&key).unwrap();
        let file = directory.join(format!("{name}.pem"));
        write_replacing(&file, certificate.pem().as_bytes());
        TestCa { certificate, key, directory: directory.to_path_buf(), name: name.to_owned(), file }
    }

    fn issue(&self, stem: &str, params: CertificateParams) -> Pair {
        let key = KeyPair::generate().unwrap();
        let certificate = params.signed_by(&key, &self.certificate, &self.key).unwrap();
        let pair = Pair {
            certificate: self.directory.join(format!("{}-{stem}.crt", self.name)),
            key: self.directory.join(format!("{}-{stem}.key", self.name)),
        };
        write_replacing(&pair.certificate, certificate.pem().as_bytes());
        write_replacing(&pair.key, key.serialize_pem().as_bytes());
        pair
    }

    /// A server certificate for 127.0.0.1 and `localhost`.
    pub fn server(&self) -> Pair {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        params.distinguished_name = distinguished_name("ringpostd");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        self.issue("server", params)
    }

    /// A client certificate with the common name `common_name` and, if given, one DNS subject
    /// alternative name (which is then its identity).
    pub fn client(&self, common_name: &str, dns_name: Option<&str>) -> Pair {
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(common_name);
        if let Some(dns_name) = dns_name {
            params.subject_alt_names = vec![SanType::DnsName(dns_name.try_into().unwrap())];
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.issue(&format!("client-{common_name}"), params)
    }
}

/// Copies `from`'s certificate and key over `to`'s files, each by a rename: what an operator
/// renewing a certificate does.
pub fn replace_pair(from: &Pair, to: &Pair) {
    write_replacing(&to.certificate, &std::fs::read(&from.certificate).unwrap());
    write_replacing(&to.key, &std::fs::read(&from.key).unwrap());
}
