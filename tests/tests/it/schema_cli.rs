//! Schemas through the native protocol: `ringpost schema …` and `ringpost topic create
//! --schema` against the real daemon, a gRPC publish then checked against what the CLI set;
//! and `pubsub.schemas.create` asked alike over gRPC and natively.

use crate::grpc_admin::{grpc_daemon, refused};
use crate::security::{access_text, client_with, daemon_requiring_auth, token, AccessFile, Files};
use ringpost_client::{block_on, ErrorCode, SchemaType};
use ringpost_tests::grpc::{project_path, pubsub, Grpc};
use ringpost_tests::{failed, json_field, succeeded};
use tonic::Code;

const AVRO: &str = r#"{"type": "record", "name": "State", "fields": [
    {"name": "name", "type": "string"}, {"name": "post_abbr", "type": "string"}]}"#;

/// The second revision: a record of one field.
const AVRO_COUNT: &str = r#"{"type": "record", "name": "Count", "fields": [{"name": "n", "type": "int"}]}"#;

#[test]
fn the_cli_creates_reads_lists_validates_and_deletes_schemas_and_sets_a_topics() {
    let (daemon, grpc) = grpc_daemon("schema-cli");
    let directory = ringpost_tests::temporary_directory("schema-cli-files");
    let file = |name: &str, text: &str| {
        let path = directory.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let (definition, broken) = (file("state.avsc", AVRO), file("broken.avsc", r#"{"type": "record"}"#));
    let (good, bad) = (file("good.json", r#"{"name": "Alaska", "post_abbr": "AK"}"#), file("bad.json", "{}"));
    let cli = |args: &[&str]| daemon.cli(args);

    let created =
        succeeded(&cli(&["schema", "create", "states", "--type", "avro", "--definition", &definition]));
    assert_eq!(json_field(&created, "name"), "states");
    assert_eq!(json_field(&created, "type"), "avro");
    let first = json_field(&created, "revision_id").to_owned();
    assert_eq!(first.len(), 8, "{created}");
    let got = succeeded(&cli(&["schema", "get", "states"]));
    assert!(got.contains("\"definition\":"), "FULL by default: {got}");
    let basic = succeeded(&cli(&["schema", "get", &format!("states@{first}"), "--basic"]));
    assert_eq!(json_field(&basic, "revision_id"), first);
    assert!(!basic.contains("\"definition\""), "{basic}");
    let listed = succeeded(&cli(&["schema", "list"]));
    assert_eq!(listed.lines().map(|line| json_field(line, "name")).collect::<Vec<_>>(), ["states"]);
    let table = succeeded(&cli(&["schema", "list", "--output", "table"]));
    assert!(table.starts_with("NAME") && table.contains("avro"), "{table}");

    // A second revision, its definition from standard input.
    let committed = daemon.cli_with_input(
        &["schema", "commit", "states", "--type", "avro", "--definition", "-"],
        Some(AVRO_COUNT),
    );
    let second = json_field(&succeeded(&committed), "revision_id").to_owned();
    assert_ne!(second, first);
    let revisions = succeeded(&cli(&["schema", "revisions", "states"]));
    let ids: Vec<&str> = revisions.lines().map(|line| json_field(line, "revision_id")).collect();
    assert_eq!(ids, [second.as_str(), first.as_str()], "newest first");

    succeeded(&cli(&["schema", "validate", "--type", "avro", "--definition", &definition]));
    let refused_definition = cli(&["schema", "validate", "--type", "avro", "--definition", &broken]);
    assert_eq!(refused_definition.status.code(), Some(1));
    assert!(failed(&refused_definition).starts_with("InvalidArgument"));
    let usage = cli(&["schema", "validate", "--type", "json-schema", "--definition", &definition]);
    assert_eq!(usage.status.code(), Some(2), "an unknown type is refused before sending");

    let at_first = format!("states@{first}");
    succeeded(&cli(&["schema", "validate-message", &at_first, "--encoding", "json", "--message", &good]));
    let mismatch = cli(&["schema", "validate-message", &at_first, "--encoding", "json", "--message", &bad]);
    assert_eq!(mismatch.status.code(), Some(1));
    assert!(failed(&mismatch).starts_with("InvalidArgument"), "{mismatch:?}");

    // A topic whose messages must match the first revision: a gRPC publish proves it took.
    let topic = succeeded(&cli(&[
        "topic",
        "create",
        "states-in",
        "--schema",
        "states",
        "--encoding",
        "json",
        "--first-revision",
        &first,
        "--last-revision",
        &first,
    ]));
    assert_eq!(json_field(&topic, "schema"), "states", "{topic}");
    assert_eq!(json_field(&topic, "encoding"), "json", "{topic}");
    let shown = succeeded(&cli(&["topic", "get", "states-in"]));
    assert_eq!(json_field(&shown, "schema"), "states", "`topic get` shows the settings: {shown}");
    assert_eq!(json_field(&shown, "first_revision_id"), first, "{shown}");
    let table = succeeded(&cli(&["topic", "get", "states-in", "--output", "table"]));
    assert!(table.lines().next().is_some_and(|header| header.ends_with("SCHEMA  ENCODING")), "{table}");
    let missing = cli(&["topic", "create", "other-in", "--schema", "nothing-here"]);
    assert!(failed(&missing).starts_with("NotFound"), "{missing:?}");
    let no_schema = cli(&["topic", "create", "other-in", "--encoding", "json"]);
    assert_eq!(no_schema.status.code(), Some(2), "--encoding goes with --schema");
    refused(grpc.publish_data("states-in", &[b"{}"]), Code::InvalidArgument, "a message of no revision");
    refused(
        grpc.publish_data("states-in", &[br#"{"n": 1}"#]),
        Code::InvalidArgument,
        "the second revision's",
    );
    grpc.publish_data("states-in", &[br#"{"name": "Alaska", "post_abbr": "AK"}"#]).unwrap();
    // Its settings cleared, then set again, by `topic update`.
    let cleared = succeeded(&cli(&["topic", "update", "states-in", "--no-schema"]));
    assert_eq!(json_field(&cleared, "schema"), "", "{cleared}");
    let shown = succeeded(&cli(&["topic", "get", "states-in"]));
    assert!(!shown.contains("schema_settings"), "a topic without a schema shows none: {shown}");
    // The gRPC API trusts the schema it learnt for a while (GRPC_SCHEMAS_CACHED_MS, 5 s): a
    // change through the native protocol is seen within it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while let Err(status) = grpc.publish_data("states-in", &[b"{}"]) {
        assert!(std::time::Instant::now() < deadline, "still checked once cleared: {status:?}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let both = cli(&["topic", "update", "states-in", "--no-schema", "--schema", "states"]);
    assert_eq!(both.status.code(), Some(2));
    let set =
        succeeded(&cli(&["topic", "update", "states-in", "--schema", "states", "--last-revision", &first]));
    assert_eq!(json_field(&set, "last_revision_id"), first, "{set}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while grpc.publish_data("states-in", &[b"{}"]).is_ok() {
        assert!(std::time::Instant::now() < deadline, "not checked again once set");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    succeeded(&cli(&["schema", "delete", &format!("states@{second}")]));
    let after = succeeded(&cli(&["schema", "revisions", "states"]));
    assert_eq!(after.lines().count(), 1, "{after}");
    succeeded(&cli(&["schema", "delete", "states"]));
    let gone = cli(&["schema", "get", "states"]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(failed(&gone).starts_with("NotFound"), "{gone:?}");
    std::fs::remove_dir_all(&directory).unwrap();
}

/// `ringpost completions bash` completes the schema command's actions.
#[test]
fn completions_name_the_schema_actions() {
    let ringpost = ringpost_tests::binary("ringpost");
    let program = format!(
        "source <({} completions bash); COMP_WORDS=(ringpost schema validate); COMP_CWORD=2; _ringpost; echo \"${{COMPREPLY[*]}}\"",
        ringpost.display()
    );
    let output = std::process::Command::new("bash").arg("-c").arg(program).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(String::from_utf8(output.stdout).unwrap().trim(), "validate validate-message");
}

/// A token whose roles lack `pubsub.schemas.create` on a schema is refused PERMISSION_DENIED
/// creating it over gRPC, natively and with the CLI; one granted `editor` on `schema:orders-*`
/// creates it both ways; a viewer reads it.
#[test]
fn creating_a_schema_needs_pubsub_schemas_create_over_grpc_and_natively() {
    let files = Files::new("schema-permission");
    let (viewer, maker) = (token("viewer"), token("maker"));
    let access = AccessFile::new(
        &files,
        &access_text(&[&viewer, &maker], &["viewer * viewer", "editor schema:orders-* maker"]),
    );
    let daemon = daemon_requiring_auth("schema-permission", &access, &["--grpc-listen", "127.0.0.1:0"]);
    let address = daemon.grpc_address.clone().expect("the gRPC API's address");
    let create = |grpc: &Grpc, id: &str| {
        grpc.create_schema(pubsub::CreateSchemaRequest {
            parent: project_path(),
            schema: Some(pubsub::Schema {
                r#type: pubsub::schema::Type::Avro as i32,
                definition: AVRO.to_owned(),
                ..Default::default()
            }),
            schema_id: id.to_owned(),
        })
    };

    let as_viewer = Grpc::connect_with_token(&address, Some(&viewer.secret));
    let message = refused(create(&as_viewer, "orders-grpc"), Code::PermissionDenied, "a viewer creates");
    assert!(message.contains("pubsub.schemas.create"), "{message}");
    let native_viewer = client_with(&daemon, &viewer);
    let error = block_on(native_viewer.create_schema("orders-native", SchemaType::Avro, AVRO)).unwrap_err();
    assert_eq!(error.code(), ErrorCode::PermissionDenied, "{error}");
    let cli = daemon.cli_with_input(
        &["--token", &viewer.secret, "schema", "create", "orders-cli", "--type", "avro", "--definition", "-"],
        Some(AVRO),
    );
    assert!(failed(&cli).starts_with("PermissionDenied"), "{cli:?}");

    let as_maker = Grpc::connect_with_token(&address, Some(&maker.secret));
    create(&as_maker, "orders-grpc").unwrap();
    let native_maker = client_with(&daemon, &maker);
    block_on(native_maker.create_schema("orders-native", SchemaType::Avro, AVRO)).unwrap();
    refused(create(&as_maker, "billing"), Code::PermissionDenied, "outside the maker's schemas");
    let read = block_on(native_viewer.get_schema("orders-grpc", true)).unwrap();
    assert_eq!(read.definition, AVRO);
    assert_eq!(block_on(native_viewer.list_schemas(false)).unwrap().len(), 2);
}
