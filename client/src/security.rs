//! How a client checks who the server is and proves who it is: TLS (rustls with ring as the
//! crypto provider) trusting only the CA the operator names, an optional client certificate
//! (mTLS), and a token, sent in an `Authenticate` frame first on every connection.
//!
//! One `Security` serves every connection a `Client` opens (the router's, each forwarder pool's,
//! each streaming pull's): the TLS configuration is built once, when the files are read, and
//! shared by them all.

use crate::{Error, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use std::path::Path;
use std::sync::Arc;

/// The environment variables `Security::from_env` reads; the CLI's flags default to them.
pub const ENV_TOKEN: &str = "RINGPOST_TOKEN";
pub const ENV_CA: &str = "RINGPOST_CA";
pub const ENV_CERT: &str = "RINGPOST_CERT";
pub const ENV_KEY: &str = "RINGPOST_KEY";
pub const ENV_SERVER_NAME: &str = "RINGPOST_SERVER_NAME";

/// The credentials and the trust of a client. `Security::default()` is plaintext without a
/// token: what a loopback daemon with authentication off expects.
#[derive(Clone, Default)]
pub struct Security {
    token: Option<Arc<str>>,
    roots: Option<Arc<RootCertStore>>,
    identity: Option<Arc<Identity>>,
    server_name: Option<String>,
    /// Built from `roots` and `identity` whenever either changes; `Some` means TLS.
    config: Option<Arc<ClientConfig>>,
}

/// A client certificate chain and its private key.
struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl std::fmt::Debug for Security {
    /// Never shows the token itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .field("tls", &self.config.is_some())
            .field("client_certificate", &self.identity.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl Security {
    /// Sends `token` in an `Authenticate` frame first on every connection.
    pub fn with_token(mut self, token: String) -> Security {
        self.token = Some(token.into());
        self
    }

    /// Turns TLS on, trusting only the certificates of the PEM file at `path` as roots.
    pub fn with_ca_file(mut self, path: &Path) -> Result<Security> {
        let mut roots = RootCertStore::empty();
        for certificate in
            CertificateDer::pem_file_iter(path).map_err(|error| pem_error("CA", path, error))?
        {
            let certificate = certificate.map_err(|error| pem_error("CA", path, error))?;
            roots.add(certificate).map_err(|error| {
                Error::Tls(format!("the CA file {} holds an unusable certificate: {error}", path.display()))
            })?;
        }
        if roots.is_empty() {
            return Err(Error::Tls(format!("the CA file {} holds no certificate", path.display())));
        }
        self.roots = Some(Arc::new(roots));
        self.rebuild()?;
        Ok(self)
    }

    /// Presents the client certificate chain of the PEM file `cert`, with the private key of the
    /// PEM file `key`, to a server that asks for one (mTLS). Needs a CA (`with_ca_file`) too.
    pub fn with_client_certificate(mut self, cert: &Path, key: &Path) -> Result<Security> {
        let chain = CertificateDer::pem_file_iter(cert)
            .map_err(|error| pem_error("certificate", cert, error))?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|error| pem_error("certificate", cert, error))?;
        if chain.is_empty() {
            return Err(Error::Tls(format!("the certificate file {} holds no certificate", cert.display())));
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|error| pem_error("key", key, error))?;
        self.identity = Some(Arc::new(Identity { chain, key }));
        self.rebuild()?;
        Ok(self)
    }

    /// The name the server's certificate must hold. By default each connection's is the host
    /// part of its address; an IP address is then checked against the certificate's IP
    /// subject alternative names.
    pub fn with_server_name(mut self, name: String) -> Security {
        self.server_name = Some(name);
        self
    }

    /// A `Security` from `RINGPOST_TOKEN`, `RINGPOST_CA`, `RINGPOST_CERT` with `RINGPOST_KEY`,
    /// and `RINGPOST_SERVER_NAME`; unset or empty variables are left out.
    pub fn from_env() -> Result<Security> {
        let variable = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        let mut security = Security::default();
        if let Some(token) = variable(ENV_TOKEN) {
            security = security.with_token(token);
        }
        if let Some(ca) = variable(ENV_CA) {
            security = security.with_ca_file(Path::new(&ca))?;
        }
        match (variable(ENV_CERT), variable(ENV_KEY)) {
            (Some(cert), Some(key)) => {
                security = security.with_client_certificate(Path::new(&cert), Path::new(&key))?
            }
            (None, None) => {}
            _ => {
                return Err(Error::Tls(format!("{ENV_CERT} and {ENV_KEY} go together: set both or neither")));
            }
        }
        if let Some(name) = variable(ENV_SERVER_NAME) {
            security = security.with_server_name(name);
        }
        Ok(security)
    }

    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Whether connections use TLS.
    pub fn is_tls(&self) -> bool {
        self.config.is_some()
    }

    /// Refuses a combination that cannot work, before anything is sent.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.identity.is_some() && self.roots.is_none() {
            return Err(Error::Tls(
                "a client certificate needs a CA to check the server with (with_ca_file, --ca)".into(),
            ));
        }
        Ok(())
    }

    /// The TLS configuration, and the name the certificate of the server at `address` must
    /// hold; `None` for plaintext.
    pub(crate) fn tls_for(&self, address: &str) -> Result<Option<(Arc<ClientConfig>, ServerName<'static>)>> {
        let Some(config) = &self.config else { return Ok(None) };
        let name = match &self.server_name {
            Some(name) => name.clone(),
            None => host_of(address).to_owned(),
        };
        let name = ServerName::try_from(name.clone())
            .map_err(|error| Error::Tls(format!("'{name}' cannot be a TLS server name: {error}")))?;
        Ok(Some((config.clone(), name)))
    }

    fn rebuild(&mut self) -> Result<()> {
        let Some(roots) = &self.roots else { return Ok(()) };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| Error::Tls(format!("TLS setup: {error}")))?
            .with_root_certificates(roots.clone());
        let config = match &self.identity {
            Some(identity) => {
                builder.with_client_auth_cert(identity.chain.clone(), identity.key.clone_key()).map_err(
                    |error| Error::Tls(format!("the client certificate and key do not go together: {error}")),
                )?
            }
            None => builder.with_no_client_auth(),
        };
        self.config = Some(Arc::new(config));
        Ok(())
    }
}

fn pem_error(what: &str, path: &Path, error: rustls::pki_types::pem::Error) -> Error {
    Error::Tls(format!("cannot read the {what} file {}: {error}", path.display()))
}

/// The host part of `host:port` (`[v6]:port` too), or the whole address if it has no port.
pub(crate) fn host_of(address: &str) -> &str {
    let host = match address.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|byte| byte.is_ascii_digit()) && !host.is_empty() => host,
        _ => address,
    };
    host.strip_prefix('[').and_then(|host| host.strip_suffix(']')).unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_name_is_the_host_of_the_address() {
        assert_eq!(host_of("127.0.0.1:7450"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7450"), "::1");
        assert_eq!(host_of("ringpost.example:7451"), "ringpost.example");
        assert_eq!(host_of("ringpost.example"), "ringpost.example");
    }

    #[test]
    fn the_token_is_never_shown() {
        let security = Security::default().with_token("rpt_secret".into());
        assert!(!format!("{security:?}").contains("secret"));
    }

    #[test]
    fn a_client_certificate_without_a_ca_is_refused() {
        let identity = Identity { chain: Vec::new(), key: PrivateKeyDer::Pkcs8(Vec::new().into()) };
        let security = Security { identity: Some(Arc::new(identity)), ..Security::default() };
        assert!(security.validate().is_err());
        assert!(Security::default().validate().is_ok());
    }
}
