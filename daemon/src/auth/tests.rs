//! The access file's parser, the role table, patterns and the decisions `Access` makes.

use super::policy::{NamePattern, Pattern, Policy, Role, Who};
use super::*;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

const ALICE_TOKEN: &str = "rpt_alice";
const BOB_TOKEN: &str = "rpt_bob";

/// A file in the system's temporary directory, removed when dropped.
struct TempFile {
    path: PathBuf,
}

impl TempFile {
    fn new(text: &str) -> TempFile {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!("ringpost-access-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let file = TempFile { path: std::env::temp_dir().join(name) };
        file.write(text);
        file
    }

    /// Replaces the file as an operator should, by renaming a new one over it (a new inode).
    fn write(&self, text: &str) {
        let next = self.path.with_extension("next");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, &self.path).unwrap();
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn token_line(principal: &str, token: &str) -> String {
    token::access_line(principal, token, None)
}

fn required(text: &str) -> (Access, TempFile, Rc<RefCell<Vec<String>>>) {
    let file = TempFile::new(text);
    let settings = AccessSettings { mode: Mode::Required, file: Some(file.path.clone()) };
    let lines = Rc::new(RefCell::new(Vec::new()));
    let sink = lines.clone();
    let access = Access::open(&settings)
        .unwrap()
        .with_audit_sink(Box::new(move |line: &str| sink.borrow_mut().push(line.to_string())));
    (access, file, lines)
}

fn standard_file() -> String {
    format!(
        "# who may do what\n\
         \n\
         {}\n\
         {}\n\
         grant publisher topic:orders-* alice\n\
         grant subscriber subscription:orders-billing alice bob\n\
         grant viewer * bob\n",
        token_line("alice", ALICE_TOKEN),
        token_line("bob", BOB_TOKEN)
    )
}

fn named(name: &str) -> Session {
    Session { principal: Principal::Named(name.into()), credential: Credential::Certificate }
}

#[test]
fn a_good_file_parses_into_its_tokens_and_grants() {
    let policy = Policy::parse(&format!(
        "  # indented comment\n\
         {} expires=2027-01-01T00:00:00Z\r\n\
         {}\n\
         token alice {}\n\
         grant admin * root\n\
         grant  editor   topic:a*b*c   alice\tbob\n",
        token_line("alice", ALICE_TOKEN),
        token_line("bob", BOB_TOKEN),
        token::digest_line("rpt_alice_rotated"),
    ))
    .unwrap();
    assert_eq!(policy.tokens.len(), 3);
    let alice = &policy.tokens[&token::digest(ALICE_TOKEN)];
    assert_eq!(&*alice.principal, "alice");
    assert_eq!(alice.expires, token::parse_rfc3339_utc("2027-01-01T00:00:00Z"));
    let rotated = &policy.tokens[&token::digest("rpt_alice_rotated")];
    assert!(Rc::ptr_eq(&rotated.principal, &alice.principal), "one principal, one name");
    assert_eq!(policy.tokens[&token::digest(BOB_TOKEN)].expires, None);
    assert!(policy.allows(Who::Named("root"), Permission::DaemonAdminister, ""));
    assert!(policy.allows(Who::Named("bob"), Permission::TopicsDelete, "a-b-c"));
    assert!(!policy.allows(Who::Named("bob"), Permission::TopicsDelete, "a-c"));
    assert!(!policy.allows(Who::Named("alice"), Permission::DaemonStats, ""));
    assert!(!policy.anonymous_may_act());
    assert!(Policy::parse("").unwrap().tokens.is_empty());
}

#[test]
fn every_error_names_its_line_and_what_is_wrong() {
    let digest = token::digest_line(ALICE_TOKEN);
    let cases = [
        ("permit viewer * bob", "unknown keyword \"permit\""),
        ("token alice", "a token line is"),
        ("token alice sha256:00", "is not a token digest"),
        (
            &format!("token alice {}", digest.to_uppercase().replace("SHA256", "sha256")),
            "is not a token digest",
        ),
        (
            &format!("token alice {digest} expires=2027-02-30T00:00:00Z"),
            "the expiry \"2027-02-30T00:00:00Z\"",
        ),
        (&format!("token alice {digest} expires=tomorrow"), "is not a UTC time"),
        (&format!("token alice {digest} until=2027-01-01T00:00:00Z"), "a token line is"),
        (&format!("token alice {digest} expires=2027-01-01T00:00:00Z extra"), "a token line is"),
        (&format!("token anonymous {digest}"), "anonymous is a special principal"),
        (&format!("token allUsers {digest}"), "allUsers is a special principal"),
        ("grant viewer", "a grant line is"),
        ("grant viewer *", "the grant names no principal"),
        ("grant owner * bob", "unknown role \"owner\""),
        ("grant viewer queue:x bob", "is not *, topic:NAME"),
        ("grant viewer topics bob", "is not *, topic:NAME"),
        ("grant viewer topic: bob", "names no resource"),
        ("grant viewer ** bob", "is not *, topic:NAME"),
        ("grant viewer * bob #alice", "is not a principal name"),
        (&format!("grant viewer * {}", "p".repeat(policy::PRINCIPAL_BYTES_MAX + 1)), "longer than 256 bytes"),
        (
            &format!("grant viewer topic:{} bob", "t".repeat(policy::PATTERN_BYTES_MAX)),
            "longer than 512 bytes",
        ),
    ];
    for (bad, expected) in cases {
        let text = format!("# a comment\n\ngrant viewer * bob\n{bad}\ngrant viewer * carol\n");
        let error = Policy::parse(&text).expect_err(bad);
        assert!(error.starts_with("line 4: "), "{bad:?} gave {error:?}");
        assert!(error.contains(expected), "{bad:?} gave {error:?}, expected {expected:?}");
    }
    let twice = format!("{}\n{}\n", token_line("alice", ALICE_TOKEN), token_line("bob", ALICE_TOKEN));
    assert_eq!(
        Policy::parse(&twice).unwrap_err(),
        "line 2: the same token digest is already given on line 1"
    );
}

#[test]
fn open_names_the_file_and_the_line_and_a_missing_file_is_an_error() {
    let file = TempFile::new("grant viewer * bob\ngrant viewer nothing bob\n");
    let settings = AccessSettings { mode: Mode::Required, file: Some(file.path.clone()) };
    let error = Access::open(&settings).err().unwrap();
    assert!(error.starts_with(&format!("access file {}, line 2: ", file.path.display())), "{error}");

    let missing = AccessSettings { mode: Mode::Off, file: Some(file.path.with_extension("missing")) };
    let error = Access::open(&missing).err().unwrap();
    assert!(error.contains("cannot open it"), "{error}");

    let binary = TempFile::new("");
    std::fs::write(&binary.path, [b'#', 0xff, b'\n']).unwrap();
    let settings = AccessSettings { mode: Mode::Required, file: Some(binary.path.clone()) };
    assert!(Access::open(&settings).err().unwrap().contains("not UTF-8"));
}

#[test]
fn each_role_holds_exactly_its_permissions() {
    use Permission::*;
    let viewer = [
        TopicsGet,
        TopicsList,
        SubscriptionsGet,
        SubscriptionsList,
        SnapshotsGet,
        SnapshotsList,
        SchemasGet,
        SchemasList,
        SchemasListRevisions,
        SchemasValidate,
        DaemonStats,
    ];
    let publisher = [TopicsPublish];
    let subscriber = [SubscriptionsConsume, SnapshotsSeek, TopicsAttachSubscription];
    for permission in Permission::ALL {
        let editor = permission != DaemonAdminister;
        assert_eq!(
            Role::Viewer.permissions().contains(permission),
            viewer.contains(&permission),
            "{permission:?}"
        );
        assert_eq!(Role::Publisher.permissions().contains(permission), publisher.contains(&permission));
        assert_eq!(Role::Subscriber.permissions().contains(permission), subscriber.contains(&permission));
        assert_eq!(Role::Editor.permissions().contains(permission), editor, "{permission:?}");
        assert!(Role::Admin.permissions().contains(permission), "{permission:?}");
    }
    for role in Role::ALL {
        assert_eq!(Role::from_name(role.name()), Some(role));
    }
}

#[test]
fn permissions_are_spelled_as_pubsub_spells_them_and_are_distinct() {
    assert_eq!(Permission::TopicsPublish.name(), "pubsub.topics.publish");
    assert_eq!(Permission::TopicsAttachSubscription.name(), "pubsub.topics.attachSubscription");
    assert_eq!(Permission::SubscriptionsConsume.name(), "pubsub.subscriptions.consume");
    let mut names: Vec<&str> = Permission::ALL.iter().map(|permission| permission.name()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), Permission::ALL.len());
    let mut bits = 0u32;
    for permission in Permission::ALL {
        assert_eq!(bits & permission.bit(), 0);
        bits |= permission.bit();
    }
}

#[test]
fn name_patterns_match_any_run_of_characters_at_each_star() {
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("orders", &["orders"], &["order", "orders-1", ""]),
        ("*", &["", "x", "anything at all"], &[]),
        ("orders-*", &["orders-", "orders-eu"], &["orders", "xorders-eu"]),
        ("*-dlq", &["-dlq", "orders-dlq"], &["orders-dlq2"]),
        ("a*b*c", &["abc", "a-b-c", "abbc", "a-c-b-c"], &["ab", "acb", "a-c"]),
        ("a**b", &["ab", "axb"], &["a"]),
        ("*x*", &["x", "axb", "xx"], &["abc"]),
        ("ab*ba", &["abba", "ab-ba"], &["aba"]),
    ];
    for (pattern, matching, other) in cases {
        let parsed = NamePattern::parse(pattern);
        for name in *matching {
            assert!(parsed.matches(name), "{pattern} should match {name:?}");
        }
        for name in *other {
            assert!(!parsed.matches(name), "{pattern} should not match {name:?}");
        }
    }
}

/// A schema's permissions are on `schema:NAME`; a grant on `topic:NAME` written before the
/// access file had them still covers the schema of that name with what it granted then (its
/// changes with `pubsub.topics.create`, its reads with `pubsub.topics.get`), and nothing more.
#[test]
fn schema_grants_cover_schemas_and_topic_grants_keep_what_they_granted_before() {
    use Permission::*;
    let policy = Policy::parse(
        "grant editor schema:orders-* schema-editor\ngrant viewer topic:orders-* topic-viewer\n\
         grant editor topic:orders-* topic-editor\ngrant viewer schema:* schema-viewer\n",
    )
    .unwrap();
    let allows =
        |who: &str, permission: Permission, name: &str| policy.allows(Who::Named(who), permission, name);
    for permission in [SchemasCreate, SchemasCommit, SchemasDelete, SchemasGet, SchemasAttach] {
        assert!(allows("schema-editor", permission, "orders-v1"), "{permission:?}");
        assert!(!allows("schema-editor", permission, "billing"), "{permission:?}");
        assert!(allows("topic-editor", permission, "orders-v1"), "{permission:?} as before");
    }
    assert!(!allows("schema-editor", TopicsCreate, "orders-v1"), "a schema's grant is not a topic's");
    assert!(allows("topic-viewer", SchemasGet, "orders-v1"));
    assert!(!allows("topic-viewer", SchemasCreate, "orders-v1"));
    assert!(allows("schema-viewer", SchemasGet, "anything"));
    assert!(allows("schema-viewer", SchemasValidate, ""));
    assert!(!allows("schema-viewer", SchemasCreate, "anything"));
    assert_eq!(
        Pattern::parse("schema:a*").unwrap(),
        Pattern::Resource { kind: ResourceKind::Schema, name: NamePattern::parse("a*") }
    );
}

#[test]
fn a_pattern_covers_only_its_kind_and_only_star_covers_the_daemon() {
    let topics = Pattern::parse("topic:*").unwrap();
    assert!(topics.matches(ResourceKind::Topic, "x"));
    assert!(!topics.matches(ResourceKind::Subscription, "x"));
    assert!(Pattern::parse("*").unwrap().matches(ResourceKind::Snapshot, "x"));

    let policy = Policy::parse(
        "grant admin topic:* topics-admin\ngrant admin subscription:s sub-admin\ngrant admin * root\n",
    )
    .unwrap();
    assert!(policy.allows(Who::Named("topics-admin"), Permission::TopicsDelete, "t"));
    assert!(!policy.allows(Who::Named("topics-admin"), Permission::SubscriptionsDelete, "t"));
    assert!(!policy.allows(Who::Named("topics-admin"), Permission::DaemonStats, ""));
    assert!(!policy.allows(Who::Named("topics-admin"), Permission::DaemonAdminister, ""));
    // Seeking is checked on the subscription, as its kind says.
    assert!(policy.allows(Who::Named("sub-admin"), Permission::SnapshotsSeek, "s"));
    assert!(!policy.allows(Who::Named("sub-admin"), Permission::SnapshotsSeek, "t"));
    assert!(policy.allows(Who::Named("root"), Permission::DaemonAdminister, ""));
}

#[test]
fn special_principals_cover_whom_they_name() {
    let policy = Policy::parse(
        "grant viewer topic:open anonymous\n\
         grant publisher topic:members allAuthenticatedUsers\n\
         grant subscriber subscription:public allUsers\n",
    )
    .unwrap();
    let (anonymous, someone) = (Who::Anonymous, Who::Named("someone"));
    assert!(policy.allows(anonymous, Permission::TopicsGet, "open"));
    assert!(!policy.allows(someone, Permission::TopicsGet, "open"), "anonymous is not everyone");
    assert!(!policy.allows(anonymous, Permission::TopicsPublish, "members"));
    assert!(policy.allows(someone, Permission::TopicsPublish, "members"));
    assert!(policy.allows(anonymous, Permission::SubscriptionsConsume, "public"));
    assert!(policy.allows(someone, Permission::SubscriptionsConsume, "public"));
    assert!(policy.anonymous_may_act());
    assert!(Policy::parse("grant viewer * allUsers\n").unwrap().anonymous_may_act());
    assert!(!Policy::parse("grant viewer * allAuthenticatedUsers\n").unwrap().anonymous_may_act());
}

#[test]
fn mode_off_allows_everything_and_logs_nothing() {
    let access = Access::off();
    let anonymous = Session::anonymous();
    for permission in Permission::ALL {
        assert!(access.check(&anonymous, permission, "x").is_ok());
        assert!(access.allows(&anonymous, permission, "x"));
    }
    assert!(access.anonymous_may_act());
    assert!(!access.is_required());
    assert_eq!(access.reload_if_changed(), None);
}

#[test]
fn required_without_a_file_refuses_everyone() {
    let access = Access::open(&AccessSettings { mode: Mode::Required, file: None }).unwrap();
    assert!(!access.anonymous_may_act());
    assert_eq!(
        access.check(&named("root"), Permission::DaemonStats, "").unwrap_err().code,
        Code::PermissionDenied
    );
    assert_eq!(
        access.check(&Session::anonymous(), Permission::DaemonStats, "").unwrap_err().code,
        Code::Unauthenticated
    );
}

#[test]
fn refusals_are_unauthenticated_without_a_credential_and_permission_denied_with_one() {
    let (access, _file, audit) = required(&standard_file());
    let alice = access.authenticate_token(ALICE_TOKEN).unwrap();
    assert_eq!(alice.principal, Principal::Named("alice".into()));
    assert!(access.check(&alice, Permission::TopicsPublish, "orders-eu").is_ok());

    let denied = access.check(&alice, Permission::TopicsPublish, "payments").unwrap_err();
    assert_eq!(denied.code, Code::PermissionDenied);
    assert_eq!(
        denied.message,
        "principal alice lacks pubsub.topics.publish on topic:payments; the roles publisher, editor and admin grant it"
    );
    let daemon = access.check(&alice, Permission::DaemonAdminister, "").unwrap_err();
    assert_eq!(
        daemon.message,
        "principal alice lacks ringpost.daemon.administer on the daemon; only the role admin grants it"
    );

    let anonymous = access.check(&Session::anonymous(), Permission::TopicsPublish, "orders-eu").unwrap_err();
    assert_eq!(anonymous.code, Code::Unauthenticated);
    assert_eq!(
        anonymous.message,
        "this request carries no credential (a token or a client certificate) and anonymous may not \
         pubsub.topics.publish on topic:orders-eu"
    );
    // A name given without a credential is no principal.
    let claimed = Session { principal: Principal::Named("alice".into()), credential: Credential::None };
    assert_eq!(
        access.check(&claimed, Permission::TopicsPublish, "orders-eu").unwrap_err().code,
        Code::Unauthenticated
    );

    assert_eq!(
        *audit.borrow(),
        [
            "ringpostd: audit: denied pubsub.topics.publish on topic:payments to alice (PermissionDenied)",
            "ringpostd: audit: denied ringpost.daemon.administer on the daemon to alice (PermissionDenied)",
            "ringpostd: audit: denied pubsub.topics.publish on topic:orders-eu to anonymous (Unauthenticated)",
            "ringpostd: audit: denied pubsub.topics.publish on topic:orders-eu to anonymous (Unauthenticated)",
        ]
    );
    // `allows` is the same decision, unlogged.
    assert!(!access.allows(&alice, Permission::TopicsPublish, "payments"));
    assert!(access.allows(&named("bob"), Permission::TopicsList, "payments"));
    assert_eq!(audit.borrow().len(), 4);
}

#[test]
fn names_in_refusals_are_one_line_and_bounded() {
    let (access, _file, audit) = required(&standard_file());
    let long = format!("evil\nringpostd: audit: forged{}", "x".repeat(10_000));
    let denied = access.check(&Session::anonymous(), Permission::TopicsGet, &long).unwrap_err();
    assert!(!denied.message.contains('\n'));
    assert!(denied.message.len() < 1_000, "{} bytes", denied.message.len());
    assert!(denied.message.contains("evil\\nringpostd"));
    assert!(!audit.borrow()[0].contains('\n'));
}

#[test]
fn a_certificate_identity_is_a_principal_with_a_credential() {
    let (access, _file, _audit) = required(&standard_file());
    let bob = access.authenticate_certificate("bob");
    assert_eq!(bob.credential, Credential::Certificate);
    assert!(access.check(&bob, Permission::SubscriptionsConsume, "orders-billing").is_ok());
    let stranger = access.authenticate_certificate("spiffe://example/stranger");
    assert_eq!(access.check(&stranger, Permission::TopicsGet, "t").unwrap_err().code, Code::PermissionDenied);
    assert!(access.still_valid(&stranger, SystemTime::now()).is_ok());
}

#[test]
fn malformed_and_unknown_tokens_are_unauthenticated_and_never_repeated() {
    let (access, _file, audit) = required(&standard_file());
    let unknown = "rpt_0123456789abcdef";
    let long = "a".repeat(TOKEN_BYTES_MAX + 1);
    let cases = [
        ("", "the token is empty"),
        (long.as_str(), "longer than 1024 bytes"),
        ("rpt_abc def", "other than printable ASCII"),
        ("rpt_é", "other than printable ASCII"),
        ("rpt_\u{7}", "other than printable ASCII"),
        (unknown, "not in the daemon's access file"),
    ];
    for (token, expected) in cases {
        let refused = access.authenticate_token(token).unwrap_err();
        assert_eq!(refused.code, Code::Unauthenticated);
        assert!(refused.message.contains(expected), "{token:?}: {}", refused.message);
        if !token.is_empty() {
            assert!(!refused.message.contains(token));
        }
    }
    assert_eq!(audit.borrow().len(), cases.len());
    assert!(audit.borrow().iter().all(|line| !line.contains(unknown)));
    assert!(access.authenticate_token(&"a".repeat(TOKEN_BYTES_MAX)).unwrap_err().message.contains("not in"));
}

#[test]
fn an_expired_token_does_not_authenticate_and_a_session_ends_when_it_expires() {
    let text =
        format!("{} expires=2027-01-01T00:00:00Z\ngrant viewer * alice\n", token_line("alice", ALICE_TOKEN));
    let (access, _file, _audit) = required(&text);
    let expiry = token::parse_rfc3339_utc("2027-01-01T00:00:00Z").unwrap();
    let before = expiry - Duration::from_secs(1);
    let session = access.authenticate_token_at(ALICE_TOKEN, before).unwrap();
    assert_eq!(
        session.credential,
        Credential::Token { digest: token::digest(ALICE_TOKEN), expires: Some(expiry) }
    );
    assert!(access.still_valid(&session, before).is_ok());

    let ended = access.still_valid(&session, expiry).unwrap_err();
    assert_eq!(ended.code, Code::Unauthenticated);
    assert_eq!(ended.message, "the token of principal alice expired at 2027-01-01T00:00:00Z");
    let refused = access.authenticate_token_at(ALICE_TOKEN, expiry).unwrap_err();
    assert_eq!(refused.code, Code::Unauthenticated);
    assert!(refused.message.contains("expired at 2027-01-01T00:00:00Z"), "{}", refused.message);
}

#[test]
fn a_token_removed_from_the_file_is_revoked_at_the_next_reload() {
    let (access, file, audit) = required(&standard_file());
    let alice = access.authenticate_token(ALICE_TOKEN).unwrap();
    let bob = access.authenticate_token(BOB_TOKEN).unwrap();
    assert_eq!(access.reload_if_changed(), None, "nothing changed yet");

    file.write(&standard_file().replace(&token_line("alice", ALICE_TOKEN), ""));
    assert_eq!(access.reload_if_changed(), Some(Ok(())));
    assert_eq!(access.reload_if_changed(), None);
    let revoked = access.still_valid(&alice, SystemTime::now()).unwrap_err();
    assert_eq!(revoked.code, Code::Unauthenticated);
    assert_eq!(
        revoked.message,
        "the token of principal alice was revoked (it is no longer in the access file)"
    );
    assert!(access.still_valid(&bob, SystemTime::now()).is_ok());
    assert!(access.authenticate_token(ALICE_TOKEN).is_err());
    assert!(access.still_valid(&Session::anonymous(), SystemTime::now()).is_ok());
    assert!(audit.borrow().last().unwrap().contains("revoked"));

    // The same token given to another principal is not the session's any more either.
    file.write(&format!("{}\n", token_line("mallory", BOB_TOKEN)));
    assert_eq!(access.reload_if_changed(), Some(Ok(())));
    assert!(access.still_valid(&bob, SystemTime::now()).unwrap_err().message.contains("revoked"));
}

#[test]
fn an_edit_in_place_is_seen_as_well_as_a_rename() {
    let (access, file, _audit) = required("grant viewer * bob\n");
    assert!(!access.allows(&named("carol"), Permission::TopicsGet, "t"));
    // The same inode, another length.
    std::fs::write(&file.path, "grant viewer * bob carol\n").unwrap();
    assert_eq!(access.reload_if_changed(), Some(Ok(())));
    assert!(access.allows(&named("carol"), Permission::TopicsGet, "t"));
}

#[test]
fn an_invalid_reload_keeps_the_old_policy_and_is_reported_once() {
    let (access, file, _audit) = required(&standard_file());
    let alice = access.authenticate_token(ALICE_TOKEN).unwrap();
    file.write("grant viewer * bob\ngrant reader * alice\n");
    let error = access.reload_if_changed().unwrap().unwrap_err();
    assert!(
        error.starts_with(&format!("access file {}, line 2: unknown role", file.path.display())),
        "{error}"
    );
    assert!(error.ends_with("the access file read before stays in force"), "{error}");
    assert_eq!(access.reload_if_changed(), None, "reported once, until it changes again");
    assert!(access.still_valid(&alice, SystemTime::now()).is_ok());
    assert!(access.check(&alice, Permission::TopicsPublish, "orders-1").is_ok());

    std::fs::remove_file(&file.path).unwrap();
    assert!(access.reload_if_changed().unwrap().unwrap_err().contains("cannot open it"));
    assert_eq!(access.reload_if_changed(), None);
    assert!(access.check(&alice, Permission::TopicsPublish, "orders-1").is_ok());

    file.write(&standard_file().replace("orders-*", "orders-eu"));
    assert_eq!(access.reload_if_changed(), Some(Ok(())));
    assert!(access.check(&alice, Permission::TopicsPublish, "orders-1").is_err());
}

#[test]
fn anonymous_may_act_follows_the_mode_and_the_file() {
    let (access, file, _audit) = required("grant viewer * bob\n");
    assert!(!access.anonymous_may_act());
    file.write("grant publisher topic:open anonymous\n");
    assert_eq!(access.reload_if_changed(), Some(Ok(())));
    assert!(access.anonymous_may_act());
    assert!(access.check(&Session::anonymous(), Permission::TopicsPublish, "open").is_ok());
}

#[test]
fn the_audit_log_of_one_access_is_rate_limited() {
    let (access, _file, audit) = required(&standard_file());
    let started = std::time::Instant::now();
    let refusals = 3 * AUDIT_LINES_PER_SECOND_MAX as usize;
    for _ in 0..refusals {
        assert!(access.check(&Session::anonymous(), Permission::TopicsDelete, "t").is_err());
    }
    access.audit_refusal("a TLS handshake from 192.0.2.1:4000: the client sent plaintext");
    // Within one second, at most the limit is written (a slow machine may cross into a second
    // window, which may write as many again).
    let written = audit.borrow().len();
    if started.elapsed() < Duration::from_secs(1) {
        assert_eq!(written, AUDIT_LINES_PER_SECOND_MAX as usize);
    } else {
        assert!(written <= 2 * AUDIT_LINES_PER_SECOND_MAX as usize);
    }
}

#[test]
fn a_generated_token_authenticates_through_its_access_line() {
    let token = token::generate();
    let expires = token::parse_rfc3339_utc("9999-01-01T00:00:00Z");
    let text = format!("{}\ngrant publisher topic:t carol\n", token::access_line("carol", &token, expires));
    let (access, _file, _audit) = required(&text);
    let carol = access.authenticate_token(&token).unwrap();
    assert_eq!(carol.principal.to_string(), "carol");
    assert!(access.check(&carol, Permission::TopicsPublish, "t").is_ok());
    assert!(access.authenticate_token(&token::generate()).is_err());
}

#[test]
fn another_node_presenting_the_clusters_secret_may_act_as_a_node() {
    let secret = "rpt_a-test-secret-of-the-clusters-nodes-0123456789";
    let access = Access::open(&AccessSettings { mode: Mode::Required, file: None })
        .unwrap()
        .with_cluster_secret(Some(secret));
    let node = access.authenticate_token(secret).expect("the cluster's secret authenticates");
    assert!(access.is_cluster_peer(&node));
    assert!(access.check(&node, Permission::DaemonStats, "").is_ok());
    // A principal named like the cluster's, without its secret, is nobody special.
    assert_eq!(
        access.check(&named(CLUSTER_PRINCIPAL), Permission::DaemonStats, "").unwrap_err().code,
        Code::PermissionDenied
    );
}

#[test]
fn a_wrong_secret_on_the_cluster_port_is_said_to_be_the_wrong_cluster_secret() {
    let secret = "rpt_a-test-secret-of-the-clusters-nodes-0123456789";
    let access = Access::for_cluster(Some(secret));
    assert!(access.authenticate_token(secret).is_ok());
    let refused = access.authenticate_token("rpt_another-secret-of-another-cluster-0123456789").unwrap_err();
    assert_eq!(refused.code, Code::Unauthenticated);
    assert!(refused.message.contains("not the cluster's secret"), "{}", refused.message);
    assert!(refused.message.contains("--cluster-secret-file"), "{}", refused.message);
    assert!(!refused.message.contains("access file"), "{}", refused.message);
}
