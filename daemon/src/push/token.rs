//! The daemon's push signing key and the OIDC tokens it signs with it: the JWT a push request
//! carries (`Authorization: Bearer`) when its subscription names a service account, and the
//! public key as a JWK Set that receivers verify those tokens against (`JWKS_PATH`).
//!
//! The key is an RSA key of `SIGNING_KEY_BITS` made at the daemon's first start and kept, as
//! PKCS#8 (DER, mode 0600), in every data directory (`SIGNING_KEY_FILE`): the data directories
//! are the daemon's disks, a minority of which may be lost and replaced, and a key kept on one
//! of them alone would then be replaced by a new one without a word, which every receiver
//! would refuse. A damaged or unreadable copy, or two copies that differ, stop the start with
//! the file's name; a copy missing where the others agree is written again from them. Nothing
//! ever replaces an existing key: receivers trust its public key.
//!
//! Tokens are signed with ring (RS256, constant-time); RustCrypto's `rsa` only makes the key.

use super::keys::PushKey;
use super::TokenSigner;
use crate::catalog::OidcToken;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::signature::{KeyPair as _, RsaKeyPair, RsaPublicKeyComponents};
use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The signing key's file, in each data directory.
pub const SIGNING_KEY_FILE: &str = "push-signing-key.pk8";
/// The signing key's size: what Google's own keys have, and the least ring accepts.
pub const SIGNING_KEY_BITS: usize = 2048;
/// The largest key file read: a PKCS#8 RSA key of `SIGNING_KEY_BITS` is about 1,200 bytes, so
/// a larger file is not ours, and is refused rather than read into memory whole.
pub const SIGNING_KEY_FILE_BYTES_MAX: u64 = 16 * 1024;
/// The issuer (`iss`) tokens claim unless `--push-token-issuer` names another: Google's, so
/// that a receiver written for Google's push tokens verifies ours unchanged once pointed at
/// this daemon's keys (`JWKS_PATH`).
pub const ISSUER_DEFAULT: &str = "https://accounts.google.com";
/// Where the monitoring endpoint serves the public keys: the path of Google's own JWK Set, so
/// that a library taking a certificates URL takes ours the same way.
pub const JWKS_PATH: &str = "/oauth2/v3/certs";
/// How long a token is valid (`exp` - `iat`), in seconds: an hour, as Google's.
pub const TOKEN_LIFETIME_SECONDS: u64 = 3600;
/// A cached token is signed again this long before it expires, so that no request carries a
/// token that expires on its way or while a receiver's clock runs a little ahead.
pub const TOKEN_RENEWAL_MARGIN_SECONDS: u64 = 300;
/// Tokens cached at most, one per (service account, audience) pushed to: past it, the cache
/// forgets those due for renewal, then any, so that subscriptions with ever new audiences
/// cannot grow it.
pub const TOKENS_CACHED_MAX: usize = 4096;

const _: () = assert!(TOKEN_RENEWAL_MARGIN_SECONDS < TOKEN_LIFETIME_SECONDS);

/// The daemon's RSA signing key, loaded for ring, with its public parts as a JWK needs them.
pub struct SigningKey {
    pair: RsaKeyPair,
    /// The RFC 7638 thumbprint of the public key (base64url of its SHA-256): the JWT header's
    /// and the JWK's `kid`, the same for the same key at every start.
    key_id: String,
    /// The public modulus and exponent, big-endian without leading zeros.
    modulus: Vec<u8>,
    exponent: Vec<u8>,
    random: ring::rand::SystemRandom,
}

/// How `SigningKey::open_or_create` found the key.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// The data directories held it (`rewritten` copies were missing and written again).
    Loaded { rewritten: Vec<PathBuf> },
    /// None held it: it was made and written to every one.
    Created,
}

/// Shows the key id alone: the private key is never printed.
impl std::fmt::Debug for SigningKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("SigningKey").field("key_id", &self.key_id).finish_non_exhaustive()
    }
}

impl SigningKey {
    /// The key kept in `data_dirs`, or a new one written to each of them if none holds it.
    /// Refuses (naming the file) a copy that cannot be read or parsed, and copies that differ.
    pub fn open_or_create(data_dirs: &[PathBuf]) -> Result<(SigningKey, Opened), String> {
        assert!(!data_dirs.is_empty(), "a daemon has at least one data directory");
        let mut found: Option<(PathBuf, Vec<u8>)> = None;
        let mut missing = Vec::new();
        for directory in data_dirs {
            let path = directory.join(SIGNING_KEY_FILE);
            match read_key_file(&path)? {
                None => missing.push(path),
                Some(bytes) => {
                    SigningKey::from_pkcs8(&bytes, &path)?;
                    match &found {
                        Some((first, kept)) if *kept != bytes => return Err(copies_differ(first, &path)),
                        Some(_) => {}
                        None => found = Some((path, bytes)),
                    }
                }
            }
        }
        let (bytes, opened) = match found {
            Some((_, bytes)) => (bytes, Opened::Loaded { rewritten: missing.clone() }),
            None => (generate_pkcs8()?, Opened::Created),
        };
        for path in &missing {
            write_key_file(path, &bytes)?;
        }
        let key = SigningKey::from_pkcs8(&bytes, &data_dirs[0].join(SIGNING_KEY_FILE))?;
        Ok((key, opened))
    }

    /// The key in the file at `path`, which must exist: for tools and tests that sign as a
    /// daemon does without making a key.
    pub fn open(path: &Path) -> Result<SigningKey, String> {
        let bytes = read_key_file(path)?.ok_or_else(|| format!("{} does not exist", path.display()))?;
        SigningKey::from_pkcs8(&bytes, path)
    }

    /// The key whose PKCS#8 document is `pkcs8`, read from `path` (named in the error).
    fn from_pkcs8(pkcs8: &[u8], path: &Path) -> Result<SigningKey, String> {
        let pair = RsaKeyPair::from_pkcs8(pkcs8).map_err(|why| {
            format!(
                "the push signing key {} is damaged ({why}); it is not replaced, since push receivers trust its \
                 public key: restore it from a backup or from another data directory, or delete it from every \
                 data directory to make a new key (receivers then fetch the new public key)",
                path.display()
            )
        })?;
        let public: RsaPublicKeyComponents<Vec<u8>> = pair.public_key().into();
        let key_id = thumbprint(&public.n, &public.e);
        Ok(SigningKey {
            pair,
            key_id,
            modulus: public.n,
            exponent: public.e,
            random: ring::rand::SystemRandom::new(),
        })
    }

    /// The key id (`kid`): the RFC 7638 thumbprint of the public key.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The public key as a JWK Set (RFC 7517) of it alone.
    pub fn jwk_set(&self) -> String {
        jwk_set(&[self.push_key()])
    }

    /// The public key as a JWK's members, as the node serves it and answers other nodes for it
    /// (`push::keys`).
    pub fn push_key(&self) -> PushKey {
        PushKey {
            key_id: self.key_id.clone(),
            modulus: URL_SAFE_NO_PAD.encode(&self.modulus),
            exponent: URL_SAFE_NO_PAD.encode(&self.exponent),
        }
    }

    /// A JWT (RS256) of `claims`, a JSON object, signed with this key.
    pub fn sign_jwt(&self, claims: &str) -> Result<String, String> {
        let header = format!(r#"{{"alg":"RS256","kid":{},"typ":"JWT"}}"#, json_string(&self.key_id));
        let mut token = format!("{}.{}", URL_SAFE_NO_PAD.encode(header), URL_SAFE_NO_PAD.encode(claims));
        let mut signature = vec![0; self.pair.public().modulus_len()];
        self.pair
            .sign(&ring::signature::RSA_PKCS1_SHA256, &self.random, token.as_bytes(), &mut signature)
            .map_err(|_| "signing a push token failed (the system's random source?)".to_owned())?;
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(&signature));
        Ok(token)
    }
}

/// `keys` as a JWK Set (RFC 7517), what `JWKS_PATH` serves: in a cluster, every node's key
/// (each node signs with its own, `push::keys`), so that tokens verify against any node's set.
pub fn jwk_set(keys: &[PushKey]) -> String {
    let keys: Vec<String> = keys
        .iter()
        .map(|key| {
            format!(
                r#"{{"kty":"RSA","alg":"RS256","use":"sig","kid":{},"n":{},"e":{}}}"#,
                json_string(&key.key_id),
                json_string(&key.modulus),
                json_string(&key.exponent),
            )
        })
        .collect();
    format!(r#"{{"keys":[{}]}}"#, keys.join(","))
}

/// The claims of a push token, in the order Google's have them. `sub` and `azp` are, in
/// Google's, the service account's numeric id; Ringpost knows only its email, which names it
/// as uniquely, so both carry the email.
pub fn push_claims(issuer: &str, email: &str, audience: &str, issued_at_seconds: u64) -> String {
    let email = json_string(email);
    format!(
        r#"{{"aud":{},"azp":{email},"email":{email},"sub":{email},"email_verified":true,"exp":{},"iat":{},"iss":{}}}"#,
        json_string(audience),
        issued_at_seconds + TOKEN_LIFETIME_SECONDS,
        issued_at_seconds,
        json_string(issuer),
    )
}

/// The daemon's `TokenSigner`: signs push tokens with its key and keeps each until
/// `TOKEN_RENEWAL_MARGIN_SECONDS` before it expires, so that a subscription pushing thousands
/// of messages a second signs once an hour, not once a message.
pub struct Signer {
    key: SigningKey,
    issuer: String,
    /// Tokens by (service account, audience): the token and when it expires (Unix seconds).
    cache: Mutex<HashMap<(String, String), (String, u64)>>,
}

impl Signer {
    pub fn new(key: SigningKey, issuer: String) -> Signer {
        Signer { key, issuer, cache: Mutex::new(HashMap::new()) }
    }

    pub fn key(&self) -> &SigningKey {
        &self.key
    }

    /// Tokens cached now.
    pub fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }
}

impl TokenSigner for Signer {
    fn sign(&self, token: &OidcToken, endpoint: &str, issued_at_seconds: u64) -> Result<String, String> {
        let audience = if token.audience.is_empty() { endpoint } else { &token.audience };
        let renewal = |expires: u64| expires.saturating_sub(TOKEN_RENEWAL_MARGIN_SECONDS);
        let key = (token.service_account_email.clone(), audience.to_owned());
        {
            let cache = self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some((cached, expires)) = cache.get(&key) {
                // A token is reused from its own issue until its renewal, and never for a time
                // before it was issued (a caller's clock stepped back gets a new one).
                let issued = expires - TOKEN_LIFETIME_SECONDS;
                if (issued..renewal(*expires)).contains(&issued_at_seconds) {
                    return Ok(cached.clone());
                }
            }
        }
        // Signed outside the lock: an RSA signature takes about a millisecond, and the other
        // threads' cached tokens should not wait for it.
        let claims = push_claims(&self.issuer, &token.service_account_email, audience, issued_at_seconds);
        let signed = self.key.sign_jwt(&claims)?;
        let mut cache = self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if cache.len() >= TOKENS_CACHED_MAX && !cache.contains_key(&key) {
            cache.retain(|_, (_, expires)| issued_at_seconds < renewal(*expires));
            if cache.len() >= TOKENS_CACHED_MAX {
                let any = cache.keys().next().cloned().expect("the cache is full");
                cache.remove(&any);
            }
        }
        cache.insert(key, (signed.clone(), issued_at_seconds + TOKEN_LIFETIME_SECONDS));
        assert!(cache.len() <= TOKENS_CACHED_MAX);
        Ok(signed)
    }
}

/// Why two copies of the key cannot both be kept.
fn copies_differ(first: &Path, second: &Path) -> String {
    format!(
        "the push signing keys {} and {} differ; keep the one receivers trust (the kid they fetched from \
         {JWKS_PATH}) in every data directory",
        first.display(),
        second.display()
    )
}

/// The bytes of the key file at `path`; `None` if there is none. A file that cannot be read,
/// or is larger than a key, is an error naming it.
fn read_key_file(path: &Path) -> Result<Option<Vec<u8>>, String> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(format!("reading the push signing key {}: {error}", path.display())),
    };
    let mut bytes = Vec::new();
    file.take(SIGNING_KEY_FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| format!("reading the push signing key {}: {error}", path.display()))?;
    if bytes.len() as u64 > SIGNING_KEY_FILE_BYTES_MAX {
        return Err(format!(
            "the push signing key {} is larger than SIGNING_KEY_FILE_BYTES_MAX ({SIGNING_KEY_FILE_BYTES_MAX} \
             bytes): it is not a key this daemon wrote",
            path.display()
        ));
    }
    Ok(Some(bytes))
}

/// Writes `bytes` to `path` whole or not at all, mode 0600: a temporary file written and
/// synced, renamed over `path`, and the directory synced so that the name outlives a power cut.
fn write_key_file(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let directory = path.parent().expect("a key file is in a data directory");
    let temporary = path.with_extension("pk8.tmp");
    let failed = |what: &str, error: std::io::Error| format!("{what} {}: {error}", temporary.display());
    // A temporary file left by a start that died half-way holds nothing anyone trusts yet.
    match std::fs::remove_file(&temporary) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(failed("removing", error)),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temporary)
        .map_err(|error| failed("creating", error))?;
    file.write_all(bytes).map_err(|error| failed("writing", error))?;
    file.sync_all().map_err(|error| failed("syncing", error))?;
    drop(file);
    std::fs::rename(&temporary, path)
        .map_err(|error| format!("renaming {} to {}: {error}", temporary.display(), path.display()))?;
    std::fs::File::open(directory).and_then(|directory| directory.sync_all()).map_err(|error| {
        format!("syncing {} after writing its push signing key: {error}", directory.display())
    })
}

/// A new RSA key of `SIGNING_KEY_BITS`, as a PKCS#8 document.
fn generate_pkcs8() -> Result<Vec<u8>, String> {
    use rsa::pkcs8::EncodePrivateKey as _;
    let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, SIGNING_KEY_BITS)
        .map_err(|error| format!("making the push signing key: {error}"))?;
    let document = key.to_pkcs8_der().map_err(|error| format!("encoding the push signing key: {error}"))?;
    Ok(document.as_bytes().to_vec())
}

/// The RFC 7638 thumbprint of an RSA public key: base64url of the SHA-256 of its required
/// members in lexicographic order, without whitespace.
fn thumbprint(modulus: &[u8], exponent: &[u8]) -> String {
    let canonical = format!(
        r#"{{"e":"{}","kty":"RSA","n":"{}"}}"#,
        URL_SAFE_NO_PAD.encode(exponent),
        URL_SAFE_NO_PAD.encode(modulus)
    );
    URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, canonical.as_bytes()))
}

/// `text` as a JSON string, quoted and escaped (RFC 8259): quotes, backslashes and control
/// characters; everything else as it is, UTF-8.
fn json_string(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for character in text.chars() {
        match character {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\n' => quoted.push_str("\\n"),
            '\r' => quoted.push_str("\\r"),
            '\t' => quoted.push_str("\\t"),
            control if (control as u32) < 0x20 => quoted.push_str(&format!("\\u{:04x}", control as u32)),
            other => quoted.push(other),
        }
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests;
