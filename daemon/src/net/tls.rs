//! TLS on the native protocol's ports: the server's certificate and key, and optionally the
//! certificate authority that client certificates are verified against, all read from PEM
//! files. Each shard holds its own `Tls` (nothing is shared between cores) and checks the
//! files each second: a changed set is loaded for new connections, an invalid one is logged
//! and the one before stays in force.

use futures_rustls::TlsAcceptor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// Whether a client must present a certificate when a client CA is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCertificates {
    /// A client without one authenticates with a token or stays anonymous.
    Optional,
    /// The handshake fails without a certificate the CA signed.
    Required,
}

/// The files TLS is configured from.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsSettings {
    /// The server's certificate chain, leaf first (PEM).
    pub certificate: PathBuf,
    /// The server's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA client certificates are verified against; `None`: none are requested.
    pub client_ca: Option<PathBuf>,
    pub client_certificates: ClientCertificates,
}

impl TlsSettings {
    fn files(&self) -> impl Iterator<Item = &Path> {
        [self.certificate.as_path(), self.key.as_path()].into_iter().chain(self.client_ca.as_deref())
    }
}

/// What the files were when last read: modification time and length of each (`None` for a
/// file that could not be examined).
type Stamp = Vec<Option<(SystemTime, u64)>>;

fn stamp(settings: &TlsSettings) -> Stamp {
    settings
        .files()
        .map(|file| std::fs::metadata(file).ok().and_then(|meta| Some((meta.modified().ok()?, meta.len()))))
        .collect()
}

/// One shard's TLS: the acceptor new connections are handshaken with.
pub struct Tls {
    files: RefCell<TlsFiles>,
}

impl Tls {
    /// Reads the files; an error names the file and what is wrong with it.
    pub fn open(settings: &TlsSettings) -> Result<Tls, String> {
        Ok(Tls { files: RefCell::new(TlsFiles::open(settings, &[])?) })
    }

    /// The acceptor for a new connection (a shared reference to the configuration).
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.files.borrow().config())
    }

    /// As `TlsFiles::reload_if_changed`.
    pub fn reload_if_changed(&self) -> Option<Result<(), String>> {
        self.files.borrow_mut().reload_if_changed()
    }
}

/// The server configuration the TLS files make, and what the files were when read, so that a
/// changed set is loaded again. A shard's `Tls` holds one; the gRPC API's accepting task holds
/// one of its own (with ALPN `h2`) and looks at the files for each new connection.
pub struct TlsFiles {
    settings: TlsSettings,
    /// The ALPN protocols offered (`h2` for gRPC, whose clients insist on it; none natively).
    alpn: Vec<Vec<u8>>,
    config: Arc<rustls::ServerConfig>,
    stamp: Stamp,
}

impl TlsFiles {
    /// Reads the files; an error names the file and what is wrong with it.
    pub fn open(settings: &TlsSettings, alpn: &[&[u8]]) -> Result<TlsFiles, String> {
        // Taken before reading, so that a file written meanwhile is read again at the next check.
        let stamp = stamp(settings);
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|protocol| protocol.to_vec()).collect();
        let config = Arc::new(server_config_with_alpn(settings, &alpn)?);
        Ok(TlsFiles { settings: settings.clone(), alpn, config, stamp })
    }

    /// The configuration for a new connection.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        self.config.clone()
    }

    /// Reads the files again if any changed since they were last read: `None` if none did,
    /// `Some(Err)` if the new set is invalid (the one before stays in force; it is not tried
    /// again until a file changes once more).
    pub fn reload_if_changed(&mut self) -> Option<Result<(), String>> {
        let now = stamp(&self.settings);
        if now == self.stamp {
            return None;
        }
        self.stamp = now;
        Some(server_config_with_alpn(&self.settings, &self.alpn).map(|config| self.config = Arc::new(config)))
    }
}

fn server_config_with_alpn(settings: &TlsSettings, alpn: &[Vec<u8>]) -> Result<rustls::ServerConfig, String> {
    let mut config = server_config(settings)?;
    config.alpn_protocols = alpn.to_vec();
    Ok(config)
}

fn certificates(file: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_file_iter(file)
        .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
        .map_err(|error| format!("{}: {error}", file.display()))?;
    if certificates.is_empty() {
        return Err(format!("{}: holds no PEM certificate", file.display()));
    }
    Ok(certificates)
}

fn server_config(settings: &TlsSettings) -> Result<rustls::ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(&settings.certificate)?;
    let key = PrivateKeyDer::from_pem_file(&settings.key)
        .map_err(|error| format!("{}: {error}", settings.key.display()))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("TLS protocol versions: {error}"))?;
    let builder = match &settings.client_ca {
        None => builder.with_no_client_auth(),
        Some(file) => {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in certificates(file)? {
                roots.add(certificate).map_err(|error| format!("{}: {error}", file.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match settings.client_certificates {
                ClientCertificates::Optional => verifier.allow_unauthenticated(),
                ClientCertificates::Required => verifier,
            };
            builder.with_client_cert_verifier(
                verifier.build().map_err(|error| format!("{}: {error}", file.display()))?,
            )
        }
    };
    builder.with_single_cert(chain, key).map_err(|error| {
        format!("{} and {}: {error}", settings.certificate.display(), settings.key.display())
    })
}

/// How a forwarder reaches the other nodes' forwarders when their ports take TLS: their
/// certificates verified against the cluster's CA (`--cluster-ca`) and the name or address it
/// dials. It presents no certificate of its own: it authenticates with the cluster's secret,
/// inside the TLS session.
pub fn replication_client_config(cluster_ca: &Path) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for certificate in certificates(cluster_ca)? {
        roots.add(certificate).map_err(|error| format!("{}: {error}", cluster_ca.display()))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("TLS protocol versions: {error}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// How push subscriptions' HTTP client verifies HTTPS endpoints: against the CA certificates of
/// `ca_file` (`--push-ca-file`) when given, else against the system's roots. Without roots at
/// all, HTTPS pushes fail their handshakes (each counted as a connection error) and plain
/// http still works, so a daemon starts on a host without a certificate bundle.
pub fn push_client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(file) => {
            for certificate in certificates(file)? {
                roots.add(certificate).map_err(|error| format!("{}: {error}", file.display()))?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            let (added, _ignored) = roots.add_parsable_certificates(native.certs);
            if added == 0 {
                crate::log_warn!(
                    "ringpostd: no system root certificates found ({} errors): HTTPS push endpoints \
                     will fail until --push-ca-file names a CA",
                    native.errors.len()
                );
            }
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("TLS protocol versions: {error}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The principal a verified client certificate names: its first DNS subject alternative
/// name, else its first URI one, else its subject's common name.
pub fn certificate_identity(certificate: &CertificateDer<'_>) -> Option<String> {
    let parsed = webpki::EndEntityCert::try_from(certificate).ok()?;
    if let Some(name) = parsed.valid_dns_names().next() {
        return Some(name.to_owned());
    }
    if let Some(uri) = parsed.valid_uri_names().next() {
        return Some(uri.to_owned());
    }
    common_name(parsed.subject())
}

/// DER tags met in a certificate's subject.
const TAG_SEQUENCE: u8 = 0x30;
const TAG_SET: u8 = 0x31;
const TAG_OID: u8 = 0x06;
const TAG_UTF8_STRING: u8 = 0x0c;
const TAG_PRINTABLE_STRING: u8 = 0x13;
const TAG_IA5_STRING: u8 = 0x16;
/// 2.5.4.3, commonName.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// Bytes a DER length may take after its first (lengths past 4 GiB do not occur here).
const DER_LENGTH_BYTES_MAX: usize = 4;

/// One DER element at the start of `input`: its tag, its contents and what follows it.
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (length, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let count = (first & 0x7f) as usize;
        if count == 0 || count > DER_LENGTH_BYTES_MAX || rest.len() < count {
            return None;
        }
        let length = rest[..count].iter().fold(0usize, |length, byte| length << 8 | *byte as usize);
        (length, &rest[count..])
    };
    if rest.len() < length {
        return None;
    }
    Some((tag, &rest[..length], &rest[length..]))
}

/// The first common name in a subject (its DER contents, without the outer sequence): a
/// sequence of sets of (OID, value) attributes.
fn common_name(mut subject: &[u8]) -> Option<String> {
    while !subject.is_empty() {
        let (tag, mut set, rest) = der_element(subject)?;
        subject = rest;
        if tag != TAG_SET {
            return None;
        }
        while !set.is_empty() {
            let (tag, attribute, rest) = der_element(set)?;
            set = rest;
            if tag != TAG_SEQUENCE {
                return None;
            }
            let (tag, oid, value) = der_element(attribute)?;
            if tag == TAG_OID && oid == OID_COMMON_NAME {
                let (tag, text, _) = der_element(value)?;
                if !matches!(tag, TAG_UTF8_STRING | TAG_PRINTABLE_STRING | TAG_IA5_STRING) {
                    return None;
                }
                return std::str::from_utf8(text).ok().map(str::to_owned);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate_with(names: Vec<rcgen::SanType>, common_name: Option<&str>) -> CertificateDer<'static> {
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = names;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "ringpost");
        if let Some(name) = common_name {
            params.distinguished_name.push(rcgen::DnType::CommonName, name);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    /// The first DNS name, else the first URI, else the common name.
    #[test]
    fn a_certificate_names_its_san_else_its_common_name() {
        let dns = rcgen::SanType::DnsName("alice.example".try_into().unwrap());
        let uri = rcgen::SanType::URI("spiffe://example/bob".try_into().unwrap());
        let both = certificate_with(vec![uri.clone(), dns], Some("carol"));
        assert_eq!(certificate_identity(&both).as_deref(), Some("alice.example"));
        let only_uri = certificate_with(vec![uri], Some("carol"));
        assert_eq!(certificate_identity(&only_uri).as_deref(), Some("spiffe://example/bob"));
        let only_name = certificate_with(vec![], Some("carol"));
        assert_eq!(certificate_identity(&only_name).as_deref(), Some("carol"));
        assert_eq!(certificate_identity(&certificate_with(vec![], None)), None);
    }

    #[test]
    fn truncated_der_is_no_name() {
        assert_eq!(der_element(&[TAG_SET, 0x85, 1, 2, 3, 4, 5]), None);
        assert_eq!(der_element(&[TAG_SET, 0x82, 0x01]), None);
        assert_eq!(der_element(&[TAG_SET, 3, 1]), None);
        assert_eq!(common_name(&[TAG_SET, 2, TAG_SEQUENCE, 9]), None);
    }
}
