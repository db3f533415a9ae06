use super::*;
use std::os::unix::fs::PermissionsExt as _;
use std::sync::OnceLock;

/// One key made for the tests that need any key: a key takes a few hundred milliseconds.
fn shared_pkcs8() -> &'static [u8] {
    static KEY: OnceLock<Vec<u8>> = OnceLock::new();
    KEY.get_or_init(|| generate_pkcs8().expect("a key"))
}

fn shared_key() -> SigningKey {
    SigningKey::from_pkcs8(shared_pkcs8(), Path::new("shared")).expect("the shared key loads")
}

/// `count` empty data directories of their own, removed when dropped.
struct Directories(Vec<PathBuf>);

impl Directories {
    fn new(label: &str, count: usize) -> Directories {
        let root = std::env::temp_dir().join(format!("ringpost-push-token-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let directories: Vec<PathBuf> = (0..count).map(|index| root.join(format!("disk{index}"))).collect();
        for directory in &directories {
            std::fs::create_dir_all(directory).expect("a data directory");
        }
        Directories(directories)
    }

    fn key_file(&self, index: usize) -> PathBuf {
        self.0[index].join(SIGNING_KEY_FILE)
    }
}

impl Drop for Directories {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0[0].parent().expect("a root"));
    }
}

fn decode(part: &str) -> Vec<u8> {
    URL_SAFE_NO_PAD.decode(part).expect("base64url")
}

#[test]
fn a_key_is_made_at_the_first_start_in_every_directory_and_loaded_at_the_next() {
    let directories = Directories::new("made", 3);
    let (made, opened) = SigningKey::open_or_create(&directories.0).expect("made");
    assert_eq!(opened, Opened::Created);
    let first = std::fs::read(directories.key_file(0)).expect("written");
    for index in 0..3 {
        let file = directories.key_file(index);
        assert_eq!(std::fs::read(&file).expect("written"), first, "every copy is the same key");
        let mode = std::fs::metadata(&file).expect("written").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{} is its owner's alone", file.display());
        assert!(!file.with_extension("pk8.tmp").exists(), "no temporary file is left");
    }
    let (loaded, opened) = SigningKey::open_or_create(&directories.0).expect("loaded");
    assert_eq!(opened, Opened::Loaded { rewritten: Vec::new() });
    assert_eq!(loaded.key_id(), made.key_id(), "the same key at every start");
    assert_eq!(SigningKey::open(&directories.key_file(2)).expect("opened").key_id(), made.key_id());
}

#[test]
fn a_missing_copy_is_written_again_from_the_others() {
    let directories = Directories::new("missing", 3);
    for index in [0, 2] {
        std::fs::write(directories.key_file(index), shared_pkcs8()).expect("a copy");
    }
    let (key, opened) = SigningKey::open_or_create(&directories.0).expect("loaded");
    assert_eq!(opened, Opened::Loaded { rewritten: vec![directories.key_file(1)] });
    assert_eq!(key.key_id(), shared_key().key_id());
    assert_eq!(std::fs::read(directories.key_file(1)).expect("rewritten"), shared_pkcs8());
}

#[test]
fn a_damaged_copy_stops_the_start_naming_it_and_is_left_as_it_is() {
    let directories = Directories::new("damaged", 3);
    for index in 0..3 {
        std::fs::write(directories.key_file(index), shared_pkcs8()).expect("a copy");
    }
    let damaged = directories.key_file(1);
    let mut bytes = shared_pkcs8().to_vec();
    bytes.truncate(bytes.len() / 2);
    for (what, contents) in [("truncated", bytes), ("garbage", b"not a key".to_vec()), ("empty", Vec::new())]
    {
        std::fs::write(&damaged, &contents).expect("damaged");
        let why =
            SigningKey::open_or_create(&directories.0).err().unwrap_or_else(|| panic!("{what}: refused"));
        assert!(why.contains(&damaged.display().to_string()), "{what}: names the file: {why}");
        assert!(why.contains("damaged"), "{what}: says why: {why}");
        assert_eq!(std::fs::read(&damaged).expect("kept"), contents, "{what}: never replaced");
    }
    std::fs::write(&damaged, vec![0u8; SIGNING_KEY_FILE_BYTES_MAX as usize + 1]).expect("too large");
    let why = SigningKey::open_or_create(&directories.0).expect_err("refused");
    assert!(
        why.contains(&damaged.display().to_string()) && why.contains("SIGNING_KEY_FILE_BYTES_MAX"),
        "{why}"
    );
}

#[test]
fn an_unreadable_key_stops_the_start_naming_it() {
    let directories = Directories::new("unreadable", 1);
    // A directory where the file should be: it exists, and cannot be read as one.
    std::fs::create_dir(directories.key_file(0)).expect("in the way");
    let why = SigningKey::open_or_create(&directories.0).expect_err("refused");
    assert!(why.contains(&directories.key_file(0).display().to_string()), "{why}");
}

#[test]
fn copies_of_two_keys_stop_the_start_naming_both() {
    let directories = Directories::new("differ", 3);
    let (_, opened) = SigningKey::open_or_create(&directories.0).expect("made");
    assert_eq!(opened, Opened::Created);
    std::fs::write(directories.key_file(2), shared_pkcs8()).expect("another key");
    let why = SigningKey::open_or_create(&directories.0).expect_err("refused");
    assert!(why.contains(&directories.key_file(0).display().to_string()), "{why}");
    assert!(why.contains(&directories.key_file(2).display().to_string()), "{why}");
}

#[test]
fn a_token_is_rs256_with_the_key_id_and_verifies_with_the_public_key() {
    let key = shared_key();
    let signer = Signer::new(shared_key(), ISSUER_DEFAULT.to_owned());
    let oidc = OidcToken { service_account_email: "pusher@example.iam".to_owned(), audience: String::new() };
    let token = signer.sign(&oidc, "https://receiver.example/push", 1_750_000_000).expect("signed");
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "{token}");
    let header = String::from_utf8(decode(parts[0])).expect("UTF-8");
    assert_eq!(header, format!(r#"{{"alg":"RS256","kid":"{}","typ":"JWT"}}"#, key.key_id()));
    let claims = String::from_utf8(decode(parts[1])).expect("UTF-8");
    assert_eq!(
        claims,
        r#"{"aud":"https://receiver.example/push","azp":"pusher@example.iam","email":"pusher@example.iam","sub":"pusher@example.iam","email_verified":true,"exp":1750003600,"iat":1750000000,"iss":"https://accounts.google.com"}"#
    );
    // Verified the way a receiver does: with the modulus and exponent the JWK Set publishes.
    let jwks = key.jwk_set();
    let member = |name: &str| {
        let start = jwks.find(&format!(r#""{name}":""#)).expect("a member") + name.len() + 4;
        jwks[start..start + jwks[start..].find('"').expect("its end")].to_owned()
    };
    assert_eq!(member("kid"), key.key_id());
    assert_eq!((member("kty"), member("alg"), member("use")), ("RSA".into(), "RS256".into(), "sig".into()));
    let public = RsaPublicKeyComponents { n: decode(&member("n")), e: decode(&member("e")) };
    assert_eq!(public.n.len() * 8, SIGNING_KEY_BITS);
    let signed = format!("{}.{}", parts[0], parts[1]);
    public
        .verify(&ring::signature::RSA_PKCS1_2048_8192_SHA256, signed.as_bytes(), &decode(parts[2]))
        .expect("the signature verifies");
    let mut forged = decode(parts[2]);
    forged[0] ^= 1;
    assert!(public.verify(&ring::signature::RSA_PKCS1_2048_8192_SHA256, signed.as_bytes(), &forged).is_err());
}

#[test]
fn the_audience_named_wins_over_the_endpoint_and_the_issuer_is_the_flags() {
    let signer = Signer::new(shared_key(), "https://ringpost.example".to_owned());
    let oidc = OidcToken { service_account_email: "a\"b@x".to_owned(), audience: "my-app".to_owned() };
    let token = signer.sign(&oidc, "https://receiver.example/push", 100).expect("signed");
    let claims = String::from_utf8(decode(token.split('.').nth(1).expect("claims"))).expect("UTF-8");
    assert_eq!(
        claims,
        r#"{"aud":"my-app","azp":"a\"b@x","email":"a\"b@x","sub":"a\"b@x","email_verified":true,"exp":3700,"iat":100,"iss":"https://ringpost.example"}"#
    );
}

#[test]
fn tokens_are_cached_per_account_and_audience_until_their_renewal() {
    let signer = Signer::new(shared_key(), ISSUER_DEFAULT.to_owned());
    let oidc = OidcToken { service_account_email: "pusher@example.iam".to_owned(), audience: String::new() };
    let issued = 1_000_000;
    let first = signer.sign(&oidc, "https://a.example", issued).expect("signed");
    let renewal = issued + TOKEN_LIFETIME_SECONDS - TOKEN_RENEWAL_MARGIN_SECONDS;
    assert_eq!(signer.sign(&oidc, "https://a.example", renewal - 1).expect("cached"), first);
    assert_ne!(signer.sign(&oidc, "https://b.example", issued).expect("signed"), first, "another audience");
    assert_eq!(signer.cached(), 2);
    let renewed = signer.sign(&oidc, "https://a.example", renewal).expect("renewed");
    assert_ne!(renewed, first, "signed again at its renewal");
    assert_eq!(signer.sign(&oidc, "https://a.example", renewal + 10).expect("cached"), renewed);
    assert_ne!(
        signer.sign(&oidc, "https://a.example", renewal - 1).expect("signed"),
        renewed,
        "clock stepped back"
    );
    assert_eq!(signer.cached(), 2);
}

#[test]
fn the_cache_never_holds_more_than_its_bound() {
    let signer = Signer::new(shared_key(), ISSUER_DEFAULT.to_owned());
    let oidc = OidcToken { service_account_email: "pusher@example.iam".to_owned(), audience: String::new() };
    // Filled with tokens due for renewal at 4,000, then new audiences at 4,000: the old ones go.
    for audience in 0..TOKENS_CACHED_MAX {
        signer.cache.lock().unwrap().insert(
            (oidc.service_account_email.clone(), format!("https://{audience}.example")),
            ("old".to_owned(), 4_000 + TOKEN_RENEWAL_MARGIN_SECONDS - 1),
        );
    }
    signer.sign(&oidc, "https://new.example", 4_000).expect("signed");
    assert_eq!(signer.cached(), 1, "those due for renewal are forgotten first");
    // Filled with tokens still good: one of them goes for the new one.
    for audience in 0..TOKENS_CACHED_MAX - 1 {
        signer.cache.lock().unwrap().insert(
            (oidc.service_account_email.clone(), format!("https://{audience}.example")),
            ("good".to_owned(), 4_000 + TOKEN_LIFETIME_SECONDS),
        );
    }
    assert_eq!(signer.cached(), TOKENS_CACHED_MAX);
    signer.sign(&oidc, "https://newer.example", 4_000).expect("signed");
    assert_eq!(signer.cached(), TOKENS_CACHED_MAX);
}

#[test]
fn the_key_id_is_the_rfc_7638_thumbprint() {
    // RFC 7638 section 3.1's example key and thumbprint.
    let modulus = decode(
        "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknj\
         hMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qM\
         QvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzK\
         nqDKgw",
    );
    assert_eq!(thumbprint(&modulus, &decode("AQAB")), "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs");
}

#[test]
fn json_strings_are_escaped() {
    assert_eq!(json_string("plain"), r#""plain""#);
    assert_eq!(json_string("a\"b\\c\nd\u{1}é"), r#""a\"b\\c\nd\u0001é""#);
}
