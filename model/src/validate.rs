//! The model's checks of names, messages and settings against its limits, and Pub/Sub's
//! defaults for settings left at 0, as pure functions of plain values: the client checks a
//! message with these before it sends it, and every protocol of the daemon checks its requests
//! with them. Every refusal is an [`Invalid`] naming the limit.

use crate::limits::*;

/// A refusal by the model's rules: always an invalid argument, whatever a protocol calls that,
/// with a message for a person that names the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub message: String,
}

impl Invalid {
    pub fn new(message: impl Into<String>) -> Invalid {
        Invalid { message: message.into() }
    }
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid argument: {}", self.message)
    }
}

impl std::error::Error for Invalid {}

/// Checks a topic, subscription or snapshot name with Pub/Sub's rules: 3 to 255 bytes,
/// starting with a letter, of letters, digits and `-_.~+%`, and not starting with `goog`.
pub fn validate_name(kind: &str, name: &str) -> Result<(), Invalid> {
    if name.len() < NAME_BYTES_MIN || name.len() > NAME_BYTES_MAX {
        return Err(Invalid::new(format!(
            "{kind} name '{}' is {} bytes; it must be {NAME_BYTES_MIN} to {NAME_BYTES_MAX} (NAME_BYTES_MIN, NAME_BYTES_MAX)",
            shorten(name),
            name.len()
        )));
    }
    let first = name.as_bytes()[0];
    if !first.is_ascii_alphabetic() {
        return Err(Invalid::new(format!("{kind} name '{}' must start with a letter", shorten(name))));
    }
    if let Some(bad) =
        name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~' | '+' | '%')))
    {
        return Err(Invalid::new(format!(
            "{kind} name '{}' has the character {bad:?}; allowed are letters, digits and -_.~+%",
            shorten(name)
        )));
    }
    // Compared in place: this runs on every publish, and lowering a copy allocated each time.
    if name.as_bytes().get(..4).is_some_and(|prefix| prefix.eq_ignore_ascii_case(b"goog")) {
        return Err(Invalid::new(format!("{kind} name '{name}' must not start with 'goog'")));
    }
    Ok(())
}

/// Bytes of a caller's text that a refusal quotes: enough to recognise a name, while a refusal
/// of a long one stays short.
pub const QUOTED_TEXT_BYTES_MAX: usize = 64;

/// `text` as a refusal quotes it: whole, or its first `QUOTED_TEXT_BYTES_MAX` bytes (cut at a
/// character's boundary) and `...`.
pub fn shorten(text: &str) -> String {
    if text.len() <= QUOTED_TEXT_BYTES_MAX {
        return text.to_owned();
    }
    let mut cut = QUOTED_TEXT_BYTES_MAX;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &text[..cut])
}

/// Checks one message's parts and returns its accounted size (data + attribute keys and
/// values + ordering key), which counts towards `PUBLISH_REQUEST_BYTES_MAX`.
pub fn validate_message<'a>(
    index: usize,
    data: &[u8],
    attributes: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    ordering_key: &str,
) -> Result<usize, Invalid> {
    let attribute_count = attributes.len();
    if attribute_count > ATTRIBUTES_COUNT_MAX {
        return Err(Invalid::new(format!(
            "message {index} has {attribute_count} attributes; the limit is {ATTRIBUTES_COUNT_MAX} (ATTRIBUTES_COUNT_MAX)"
        )));
    }
    let mut size = data.len() + ordering_key.len();
    for (key, value) in attributes {
        if key.is_empty() {
            return Err(Invalid::new(format!("message {index} has an attribute with an empty key")));
        }
        if key.len() > ATTRIBUTE_KEY_BYTES_MAX {
            return Err(Invalid::new(format!(
                "message {index} has an attribute key of {} bytes; the limit is {ATTRIBUTE_KEY_BYTES_MAX} (ATTRIBUTE_KEY_BYTES_MAX)",
                key.len()
            )));
        }
        if value.len() > ATTRIBUTE_VALUE_BYTES_MAX {
            return Err(Invalid::new(format!(
                "message {index} attribute '{}' has a value of {} bytes; the limit is {ATTRIBUTE_VALUE_BYTES_MAX} (ATTRIBUTE_VALUE_BYTES_MAX)",
                shorten(key),
                value.len()
            )));
        }
        size += key.len() + value.len();
    }
    if data.is_empty() && attribute_count == 0 {
        return Err(Invalid::new(format!(
            "message {index} is empty: a message needs data or at least one attribute"
        )));
    }
    if ordering_key.len() > ORDERING_KEY_BYTES_MAX {
        return Err(Invalid::new(format!(
            "message {index} has an ordering key of {} bytes; the limit is {ORDERING_KEY_BYTES_MAX} (ORDERING_KEY_BYTES_MAX)",
            ordering_key.len()
        )));
    }
    if size > MESSAGE_BYTES_MAX {
        return Err(Invalid::new(format!(
            "message {index} is {size} bytes; the limit is {MESSAGE_BYTES_MAX} (MESSAGE_BYTES_MAX)"
        )));
    }
    Ok(size)
}

/// Checks a subscription's ack deadline; 0 stands for the default.
pub fn effective_ack_deadline_seconds(requested: u32) -> Result<u32, Invalid> {
    match requested {
        0 => Ok(ACK_DEADLINE_SECONDS_DEFAULT),
        ACK_DEADLINE_SECONDS_MIN..=ACK_DEADLINE_SECONDS_MAX => Ok(requested),
        _ => Err(Invalid::new(format!(
            "ack deadline of {requested} s is outside {ACK_DEADLINE_SECONDS_MIN} to {ACK_DEADLINE_SECONDS_MAX} s (ACK_DEADLINE_SECONDS_MIN, ACK_DEADLINE_SECONDS_MAX)"
        ))),
    }
}

/// Checks a retention duration; 0 stands for the default.
pub fn effective_retention_seconds(requested: u64) -> Result<u64, Invalid> {
    match requested {
        0 => Ok(RETENTION_SECONDS_DEFAULT),
        RETENTION_SECONDS_MIN..=RETENTION_SECONDS_MAX => Ok(requested),
        _ => Err(Invalid::new(format!(
            "message retention of {requested} s is outside {RETENTION_SECONDS_MIN} to {RETENTION_SECONDS_MAX} s (10 minutes to 31 days; RETENTION_SECONDS_MIN, RETENTION_SECONDS_MAX)"
        ))),
    }
}

/// Checks a topic's message retention; 0 means not set (messages are kept until every
/// subscription has acknowledged them).
pub fn topic_retention_seconds(requested: u64) -> Result<u64, Invalid> {
    match requested {
        0 => Ok(0),
        requested => effective_retention_seconds(requested),
    }
}

/// Checks a subscription's expiration policy (seconds of inactivity); 0 stands for the default,
/// and `EXPIRATION_TTL_SECONDS_NEVER` for a subscription that never expires.
pub fn effective_expiration_ttl_seconds(requested: u64) -> Result<u64, Invalid> {
    match requested {
        0 => Ok(EXPIRATION_TTL_SECONDS_DEFAULT),
        EXPIRATION_TTL_SECONDS_NEVER => Ok(EXPIRATION_TTL_SECONDS_NEVER),
        ttl if ttl < EXPIRATION_TTL_SECONDS_MIN => Err(Invalid::new(format!(
            "expiration ttl of {ttl} s is below the minimum of one day (EXPIRATION_TTL_SECONDS_MIN)"
        ))),
        ttl => Ok(ttl),
    }
}

/// Checks a dead-letter policy and returns its delivery attempts: 0 stands for the default, and
/// without a dead-letter topic there is no policy (0 attempts, the only value allowed then).
/// Whether the topic exists is the router's to check.
pub fn effective_max_delivery_attempts(dead_letter_topic: &str, requested: u32) -> Result<u32, Invalid> {
    if dead_letter_topic.is_empty() {
        if requested != 0 {
            return Err(Invalid::new("max_delivery_attempts needs a dead_letter_topic"));
        }
        return Ok(0);
    }
    validate_name("dead-letter topic", dead_letter_topic)?;
    match requested {
        0 => Ok(MAX_DELIVERY_ATTEMPTS_DEFAULT),
        MAX_DELIVERY_ATTEMPTS_MIN..=MAX_DELIVERY_ATTEMPTS_MAX => Ok(requested),
        attempts => Err(Invalid::new(format!(
            "max_delivery_attempts is {attempts}; it must be {MAX_DELIVERY_ATTEMPTS_MIN} to {MAX_DELIVERY_ATTEMPTS_MAX} (0 means {MAX_DELIVERY_ATTEMPTS_DEFAULT}; MAX_DELIVERY_ATTEMPTS_MIN, MAX_DELIVERY_ATTEMPTS_MAX)"
        ))),
    }
}

/// Checks a retry policy's bounds as a protocol with presence gives them (`None`: not given,
/// Pub/Sub's default, `BACKOFF_SECONDS_MINIMUM_DEFAULT` and `BACKOFF_SECONDS_MAXIMUM_DEFAULT`)
/// and returns them: each 0 to `BACKOFF_SECONDS_MAX`, the minimum at most the maximum, as
/// Pub/Sub allows. (0, 0) is stored as no retry policy, which delivers a failed message again at
/// once, as a policy of (0, 0) would. A refusal names the values as the caller gave them, and a
/// default it applied as such.
pub fn retry_backoff_seconds(minimum: Option<u32>, maximum: Option<u32>) -> Result<(u32, u32), Invalid> {
    let described = |name: &str, value: Option<u32>, default: u32| match value {
        Some(seconds) => format!("{name} of {seconds} s"),
        None => format!("{name} (not given: the default, {default} s)"),
    };
    let minimum_text = described("minimum_backoff", minimum, BACKOFF_SECONDS_MINIMUM_DEFAULT);
    let maximum_text = described("maximum_backoff", maximum, BACKOFF_SECONDS_MAXIMUM_DEFAULT);
    let minimum_seconds = minimum.unwrap_or(BACKOFF_SECONDS_MINIMUM_DEFAULT);
    let maximum_seconds = maximum.unwrap_or(BACKOFF_SECONDS_MAXIMUM_DEFAULT);
    for (text, seconds) in [(&minimum_text, minimum_seconds), (&maximum_text, maximum_seconds)] {
        if seconds > BACKOFF_SECONDS_MAX {
            return Err(Invalid::new(format!(
                "retry policy's {text} is above {BACKOFF_SECONDS_MAX} s: each bound must be 0 to {BACKOFF_SECONDS_MAX} s (BACKOFF_SECONDS_MAX)"
            )));
        }
    }
    if minimum_seconds > maximum_seconds {
        return Err(Invalid::new(format!(
            "retry policy's {minimum_text} is above its {maximum_text}: the minimum must be at most the maximum"
        )));
    }
    Ok((minimum_seconds, maximum_seconds))
}

/// Checks a retry policy as the native protocol and the catalog carry it, in seconds without
/// presence, and returns it: (0, 0) is no policy; otherwise the minimum is as given (0 is no
/// wait, which Pub/Sub allows) and a maximum of 0 stands for the default (600 s), since a
/// maximum of 0 below a minimum above 0 could only be refused. A client that wants Pub/Sub's
/// default minimum sends it (10 s), as the CLI does for a bound it was not given. The values
/// this returns come back unchanged, so a stored policy checked again is itself.
pub fn effective_retry_backoff_seconds(minimum: u32, maximum: u32) -> Result<(u32, u32), Invalid> {
    if minimum == 0 && maximum == 0 {
        return Ok((0, 0));
    }
    retry_backoff_seconds(Some(minimum), (maximum != 0).then_some(maximum))
}

/// Checks labels with Pub/Sub's rules: at most `LABELS_COUNT_MAX`; each key 1 to
/// `LABEL_KEY_BYTES_MAX` bytes of lowercase letters, digits, `_` and `-`, starting with a
/// lowercase letter; each value at most `LABEL_VALUE_BYTES_MAX` bytes of the same characters.
/// (Pub/Sub also allows international lowercase letters; Ringpost keeps to ASCII.)
pub fn validate_labels(labels: &std::collections::BTreeMap<String, String>) -> Result<(), Invalid> {
    if labels.len() > LABELS_COUNT_MAX {
        return Err(Invalid::new(format!(
            "{} labels; at most {LABELS_COUNT_MAX} are allowed (LABELS_COUNT_MAX)",
            labels.len()
        )));
    }
    for (key, value) in labels {
        if key.is_empty() || key.len() > LABEL_KEY_BYTES_MAX {
            return Err(Invalid::new(format!(
                "label key '{}' is {} bytes; it must be 1 to {LABEL_KEY_BYTES_MAX} (LABEL_KEY_BYTES_MAX)",
                shorten(key),
                key.len()
            )));
        }
        if !key.as_bytes()[0].is_ascii_lowercase() {
            return Err(Invalid::new(format!(
                "label key '{}' must start with a lowercase letter",
                shorten(key)
            )));
        }
        if value.len() > LABEL_VALUE_BYTES_MAX {
            return Err(Invalid::new(format!(
                "the value of label '{}' is {} bytes; the limit is {LABEL_VALUE_BYTES_MAX} (LABEL_VALUE_BYTES_MAX)",
                shorten(key),
                value.len()
            )));
        }
        for (what, text) in [("key", key), ("value", value)] {
            if let Some(bad) = text.chars().find(|c| !is_label_character(*c)) {
                return Err(Invalid::new(format!(
                    "label {what} '{}' has the character {bad:?}; allowed are lowercase letters, digits, _ and -",
                    shorten(text)
                )));
            }
        }
    }
    Ok(())
}

fn is_label_character(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-'
}

/// Checks a push subscription's endpoint as Pub/Sub does: an absolute `http` or `https` URL
/// with a host (and, when it names one, a port of 1 to 65535), at most
/// `PUSH_ENDPOINT_BYTES_MAX` bytes, with no spaces or control characters. An empty endpoint is
/// not checked here: it means pull.
pub fn validate_push_endpoint(endpoint: &str) -> Result<(), Invalid> {
    let refuse = |why: &str| Invalid::new(format!("invalid push endpoint '{}': {why}", shorten(endpoint)));
    if endpoint.len() > PUSH_ENDPOINT_BYTES_MAX {
        return Err(refuse(&format!(
            "it is {} bytes; the limit is {PUSH_ENDPOINT_BYTES_MAX} (PUSH_ENDPOINT_BYTES_MAX)",
            endpoint.len()
        )));
    }
    if endpoint.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(refuse("it has a space or a control character"));
    }
    let Some((scheme, rest)) = endpoint.split_once("://") else {
        return Err(refuse("it must be an absolute http:// or https:// URL"));
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(refuse("its scheme must be http or https"));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err(refuse("it must not carry a user name or password"));
    }
    // A bracketed IPv6 address holds colons of its own; the port follows the bracket.
    let (host, port) = match authority.strip_prefix('[') {
        Some(bracketed) => match bracketed.split_once(']') {
            Some((address, after)) if !address.is_empty() => match after {
                "" => (address, None),
                after => match after.strip_prefix(':') {
                    Some(port) => (address, Some(port)),
                    None => return Err(refuse("it has text after its IPv6 address")),
                },
            },
            _ => return Err(refuse("its IPv6 address is not closed by ']'")),
        },
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    if host.is_empty() {
        return Err(refuse("it has no host"));
    }
    if let Some(port) = port {
        if !port.parse::<u16>().is_ok_and(|port| port > 0) {
            return Err(refuse("its port must be a number from 1 to 65535"));
        }
    }
    Ok(())
}

/// Checks a push configuration's attributes: at most `PUSH_ATTRIBUTES_COUNT_MAX`, each key and
/// value within a message attribute's sizes.
pub fn validate_push_attributes(
    attributes: &std::collections::BTreeMap<String, String>,
) -> Result<(), Invalid> {
    if attributes.len() > PUSH_ATTRIBUTES_COUNT_MAX {
        return Err(Invalid::new(format!(
            "{} push configuration attributes; at most {PUSH_ATTRIBUTES_COUNT_MAX} are allowed (PUSH_ATTRIBUTES_COUNT_MAX)",
            attributes.len()
        )));
    }
    for (key, value) in attributes {
        if key.is_empty() || key.len() > ATTRIBUTE_KEY_BYTES_MAX || value.len() > ATTRIBUTE_VALUE_BYTES_MAX {
            return Err(Invalid::new(format!(
                "push configuration attribute '{}' must have a key of 1 to {ATTRIBUTE_KEY_BYTES_MAX} bytes and a value of at most {ATTRIBUTE_VALUE_BYTES_MAX} (ATTRIBUTE_KEY_BYTES_MAX, ATTRIBUTE_VALUE_BYTES_MAX)",
                shorten(key)
            )));
        }
    }
    Ok(())
}

/// Checks a project id (Pub/Sub's `projects/{project}`): lowercase letters, digits and
/// hyphens, starting with a letter and not ending with a hyphen, or a domain-scoped one
/// (`example.com:project`); at most `PROJECT_BYTES_MAX` bytes. Google's ids are 6 to 30
/// characters, but the emulator's users often give a shorter made-up one ("test"), so only the
/// characters and the bounds are enforced: what Google would take is taken, and so is what the
/// emulator took.
pub fn validate_project(project: &str) -> Result<(), Invalid> {
    let shape_ok = (1..=63).contains(&project.len())
        && project.starts_with(|c: char| c.is_ascii_lowercase())
        && !project.ends_with('-')
        && project.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    let domain_scoped = project.len() <= PROJECT_BYTES_MAX
        && project.split_once(':').is_some_and(|(domain, id)| {
            !domain.is_empty()
                && domain
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
                && !id.is_empty()
                && id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        });
    if shape_ok || domain_scoped {
        Ok(())
    } else {
        Err(Invalid::new(format!(
            "project '{}' is not a project id (lowercase letters, digits and hyphens, starting with a letter; at most {PROJECT_BYTES_MAX} bytes, PROJECT_BYTES_MAX)",
            shorten(project)
        )))
    }
}

/// Checks a push configuration's OIDC token: a service account email is required (it is the
/// token's `email` and `sub`), of the form `name@domain`; the audience is optional (empty: the
/// endpoint's URL). Each at most `PUSH_TOKEN_FIELD_BYTES_MAX` bytes.
pub fn validate_push_token(service_account_email: &str, audience: &str) -> Result<(), Invalid> {
    for (what, text) in [("service_account_email", service_account_email), ("audience", audience)] {
        if text.len() > PUSH_TOKEN_FIELD_BYTES_MAX {
            return Err(Invalid::new(format!(
                "oidc_token.{what} is {} bytes; the limit is {PUSH_TOKEN_FIELD_BYTES_MAX} (PUSH_TOKEN_FIELD_BYTES_MAX)",
                text.len()
            )));
        }
        if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Invalid::new(format!(
                "oidc_token.{what} '{}' has a space or a control character",
                shorten(text)
            )));
        }
    }
    if service_account_email.is_empty() {
        return Err(Invalid::new(
            "oidc_token.service_account_email is required: the token names the service account it is for",
        ));
    }
    match service_account_email.split_once('@') {
        Some((name, domain)) if !name.is_empty() && !domain.is_empty() && !domain.contains('@') => Ok(()),
        _ => Err(Invalid::new(format!(
            "oidc_token.service_account_email '{}' is not an email address",
            shorten(service_account_email)
        ))),
    }
}

/// What Pub/Sub answers when exactly-once delivery and push are asked of one subscription:
/// exactly-once delivery is for pull subscriptions only.
pub const PUSH_EXACTLY_ONCE_REFUSAL: &str =
    "exactly-once delivery is not supported on push subscriptions: it is available for pull subscriptions only";

/// Refuses a subscription that would both push and deliver exactly once, whichever was asked
/// for last.
pub fn validate_push_delivery(push: bool, exactly_once: bool) -> Result<(), Invalid> {
    if push && exactly_once {
        return Err(Invalid::new(PUSH_EXACTLY_ONCE_REFUSAL));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_endpoints_are_absolute_http_urls_with_a_host() {
        for good in [
            "https://example.com/push",
            "http://localhost:8080",
            "HTTPS://example.com",
            "http://127.0.0.1:9/a?b=c#d",
            "http://[::1]:8080/push",
            "https://[2001:db8::1]/",
        ] {
            assert_eq!(validate_push_endpoint(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("example.com/push", "absolute"),
            ("/push", "absolute"),
            ("ftp://example.com", "scheme"),
            ("https://", "no host"),
            ("https:///push", "no host"),
            ("http://:8080/", "no host"),
            ("http://example.com:0/", "port"),
            ("http://example.com:99999/", "port"),
            ("http://example.com:x/", "port"),
            ("http://user:secret@example.com/", "user name"),
            ("http://[::1/", "IPv6"),
            ("http://exa mple.com/", "space"),
        ] {
            let refusal = validate_push_endpoint(bad).unwrap_err();
            assert!(refusal.message.contains(why), "{bad}: {refusal}");
            assert!(refusal.message.starts_with("invalid push endpoint"), "{refusal}");
        }
        let long = format!("https://example.com/{}", "a".repeat(PUSH_ENDPOINT_BYTES_MAX));
        assert!(validate_push_endpoint(&long).unwrap_err().message.contains("PUSH_ENDPOINT_BYTES_MAX"));
    }

    #[test]
    fn a_push_token_names_a_service_account_and_push_excludes_exactly_once() {
        assert_eq!(validate_push_token("pusher@p.iam.gserviceaccount.com", ""), Ok(()));
        assert!(validate_push_token("", "aud").unwrap_err().message.contains("required"));
        assert!(validate_push_token("pusher", "").unwrap_err().message.contains("not an email"));
        assert!(validate_push_token("a@b", "with space").is_err());
        assert_eq!(validate_push_delivery(true, false), Ok(()));
        assert_eq!(validate_push_delivery(false, true), Ok(()));
        let refusal = validate_push_delivery(true, true).unwrap_err();
        assert!(refusal.message.contains("not supported on push subscriptions"), "{refusal}");
        let many = (0..=PUSH_ATTRIBUTES_COUNT_MAX).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(validate_push_attributes(&many).unwrap_err().message.contains("PUSH_ATTRIBUTES_COUNT_MAX"));
    }

    #[test]
    fn refusals_name_the_limit_and_quote_at_most_64_bytes() {
        let long = format!("a{}", "é".repeat(200));
        let refusal = validate_name("topic", &long).unwrap_err();
        assert!(refusal.message.contains("NAME_BYTES_MAX"), "{refusal}");
        assert!(refusal.message.contains(&format!("'{}'", shorten(&long))), "{refusal}");
        assert!(shorten(&long).len() <= QUOTED_TEXT_BYTES_MAX + "...".len());
        assert_eq!(shorten("orders"), "orders");
    }

    #[test]
    fn settings_left_at_0_take_pub_subs_defaults() {
        assert_eq!(effective_ack_deadline_seconds(0), Ok(ACK_DEADLINE_SECONDS_DEFAULT));
        assert_eq!(effective_retention_seconds(0), Ok(RETENTION_SECONDS_DEFAULT));
        assert_eq!(topic_retention_seconds(0), Ok(0), "a topic's retention left at 0 is not set");
        assert_eq!(effective_expiration_ttl_seconds(0), Ok(EXPIRATION_TTL_SECONDS_DEFAULT));
        assert_eq!(effective_max_delivery_attempts("dead", 0), Ok(MAX_DELIVERY_ATTEMPTS_DEFAULT));
        assert_eq!(effective_max_delivery_attempts("", 0), Ok(0));
        assert_eq!(effective_retry_backoff_seconds(5, 0), Ok((5, BACKOFF_SECONDS_MAXIMUM_DEFAULT)));
        assert_eq!(
            effective_max_delivery_attempts("", 5),
            Err(Invalid::new("max_delivery_attempts needs a dead_letter_topic"))
        );
    }

    fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        pairs.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect()
    }

    #[test]
    fn labels_follow_pub_subs_rules_and_refusals_name_the_limit() {
        assert_eq!(validate_labels(&labels(&[])), Ok(()));
        let key_max = format!("k{}", "a".repeat(LABEL_KEY_BYTES_MAX - 1));
        let value_max = "v".repeat(LABEL_VALUE_BYTES_MAX);
        assert_eq!(
            validate_labels(&labels(&[("env", ""), ("team_1-x", "a-b_9"), (&key_max, &value_max)])),
            Ok(())
        );
        let refusal = |pairs: &[(&str, &str)]| validate_labels(&labels(pairs)).unwrap_err().message;
        assert!(refusal(&[("", "x")]).contains("LABEL_KEY_BYTES_MAX"));
        assert!(refusal(&[(&format!("{key_max}a"), "x")]).contains("LABEL_KEY_BYTES_MAX"));
        assert!(refusal(&[("k", &format!("{value_max}v"))]).contains("LABEL_VALUE_BYTES_MAX"));
        assert!(refusal(&[("1abc", "x")]).contains("lowercase letter"));
        assert!(refusal(&[("_abc", "x")]).contains("lowercase letter"));
        assert!(refusal(&[("Env", "x")]).contains("lowercase letter"));
        assert!(refusal(&[("eNv", "x")]).contains("'N'"));
        assert!(refusal(&[("env", "Prod")]).contains("'P'"));
        assert!(refusal(&[("env", "a.b")]).contains("'.'"));
        let many: Vec<(String, String)> =
            (0..=LABELS_COUNT_MAX).map(|n| (format!("k{n}"), String::new())).collect();
        let many: std::collections::BTreeMap<String, String> = many.into_iter().collect();
        assert!(validate_labels(&many).unwrap_err().message.contains("LABELS_COUNT_MAX"));
        let most: std::collections::BTreeMap<String, String> =
            many.into_iter().take(LABELS_COUNT_MAX).collect();
        assert_eq!(validate_labels(&most), Ok(()));
    }

    #[test]
    fn an_expiration_policy_may_never_expire() {
        assert_eq!(
            effective_expiration_ttl_seconds(EXPIRATION_TTL_SECONDS_NEVER),
            Ok(EXPIRATION_TTL_SECONDS_NEVER)
        );
        assert!(effective_expiration_ttl_seconds(EXPIRATION_TTL_SECONDS_MIN - 1).is_err());
    }

    /// Pub/Sub allows 0 to 600 s for both bounds: a minimum of 0 is no wait, not the default,
    /// and a refusal names what the caller gave (it named a default of 10 the caller never
    /// sent: "retry backoff of 10 to 1 s").
    #[test]
    fn a_retry_policy_may_start_at_0_and_refusals_name_what_was_given() {
        assert_eq!(retry_backoff_seconds(Some(0), Some(1)), Ok((0, 1)));
        assert_eq!(retry_backoff_seconds(Some(0), None), Ok((0, BACKOFF_SECONDS_MAXIMUM_DEFAULT)));
        assert_eq!(retry_backoff_seconds(None, Some(60)), Ok((BACKOFF_SECONDS_MINIMUM_DEFAULT, 60)));
        assert_eq!(retry_backoff_seconds(None, None), Ok((10, 600)));
        assert_eq!(retry_backoff_seconds(Some(600), Some(600)), Ok((600, 600)));
        let refusal = |minimum, maximum| retry_backoff_seconds(minimum, maximum).unwrap_err().message;
        assert_eq!(
            refusal(Some(30), Some(20)),
            "retry policy's minimum_backoff of 30 s is above its maximum_backoff of 20 s: the minimum must be at most the maximum"
        );
        assert!(refusal(None, Some(5)).contains("minimum_backoff (not given: the default, 10 s)"));
        assert!(refusal(Some(601), None).contains("minimum_backoff of 601 s is above 600 s"));
        assert!(refusal(Some(1), Some(601)).contains("BACKOFF_SECONDS_MAX"));
        // The native form: (0, 0) is none, 0 as a minimum is 0, 0 as a maximum is the default.
        assert_eq!(effective_retry_backoff_seconds(0, 0), Ok((0, 0)));
        assert_eq!(effective_retry_backoff_seconds(0, 1), Ok((0, 1)));
        assert_eq!(effective_retry_backoff_seconds(0, 60), Ok((0, 60)));
        assert_eq!(effective_retry_backoff_seconds(30, 0), Ok((30, BACKOFF_SECONDS_MAXIMUM_DEFAULT)));
        assert!(effective_retry_backoff_seconds(30, 20).is_err());
        // What it returns, checked again, is itself (the router checks a gRPC policy again).
        for (minimum, maximum) in [(0, 0), (0, 1), (0, 600), (10, 600), (600, 600), (5, 60)] {
            let checked = effective_retry_backoff_seconds(minimum, maximum).unwrap();
            assert_eq!(effective_retry_backoff_seconds(checked.0, checked.1), Ok(checked));
        }
    }
}
