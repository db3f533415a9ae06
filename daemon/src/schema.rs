//! Pub/Sub's schemas, checked without I/O: a schema's definition compiled (`Compiled::new`, an
//! Avro schema or a Protocol Buffer definition's first message), and a message's data checked
//! against it in its topic's encoding (`Compiled::check`), as Pub/Sub checks a publish.
//!
//! Avro's JSON encoding is read against the schema here (`check_avro_json`): apache-avro reads
//! binary datums, but has no reader of a JSON datum, and its conversion from JSON values knows
//! no schema (a union's `{"type": value}` wrapping, bytes as code points).

use crate::catalog::schemas::{SchemaEncoding, SchemaRevision, SchemaSettings, SchemaType};
use apache_avro::schema::{Name, Schema as AvroSchema};
use prost_reflect::{DynamicMessage, MessageDescriptor};
use serde_json::Value as Json;
use std::collections::HashMap;

/// The file name a Protocol Buffer definition is compiled under (it names no file of its own).
const PROTOCOL_BUFFER_FILE: &str = "schema.proto";
/// How deep a JSON datum may nest while it is checked against an Avro schema: deeper is
/// refused rather than risk the shard's stack (serde_json itself stops at 128).
pub const SCHEMA_JSON_DEPTH_MAX: usize = 128;

/// A schema revision's definition, compiled to check messages against.
#[derive(Debug)]
pub enum Compiled {
    Avro(AvroSchema),
    /// The definition's first message, as Pub/Sub takes it.
    ProtocolBuffer(MessageDescriptor),
}

impl Compiled {
    /// Compiles `definition`, or says why it is no schema of `schema_type`.
    pub fn new(schema_type: SchemaType, definition: &str) -> Result<Compiled, String> {
        match schema_type {
            SchemaType::Avro => AvroSchema::parse_str(definition)
                .map(Compiled::Avro)
                .map_err(|error| format!("Invalid Avro schema: {error}")),
            SchemaType::ProtocolBuffer => compile_protocol_buffer(definition).map(Compiled::ProtocolBuffer),
        }
    }

    /// Whether `data` is a message of this schema in `encoding`; if not, why.
    pub fn check(&self, encoding: SchemaEncoding, data: &[u8]) -> Result<(), String> {
        match (self, encoding) {
            (Compiled::Avro(schema), SchemaEncoding::Binary) => {
                let mut reader = Starving { rest: data, starved: false };
                let value = apache_avro::from_avro_datum(schema, &mut reader, None)
                    .map_err(|error| format!("invalid Avro binary: {error}"))?;
                if reader.starved || !value.validate(schema) {
                    return Err("invalid Avro binary: the datum ends early".to_owned());
                }
                match reader.rest.is_empty() {
                    true => Ok(()),
                    false => Err(format!("{} bytes after the Avro datum", reader.rest.len())),
                }
            }
            (Compiled::Avro(schema), SchemaEncoding::Json) => {
                let json: Json =
                    serde_json::from_slice(data).map_err(|error| format!("invalid JSON: {error}"))?;
                let names = avro_names(schema)?;
                check_avro_json(&json, schema, &names, 0)
            }
            (Compiled::ProtocolBuffer(message), SchemaEncoding::Binary) => {
                DynamicMessage::decode(message.clone(), data)
                    .map(drop)
                    .map_err(|error| format!("invalid Protocol Buffer binary: {error}"))
            }
            (Compiled::ProtocolBuffer(message), SchemaEncoding::Json) => {
                let mut deserializer = serde_json::Deserializer::from_slice(data);
                DynamicMessage::deserialize(message.clone(), &mut deserializer)
                    .and_then(|_| deserializer.end())
                    .map_err(|error| format!("invalid Protocol Buffer JSON: {error}"))
            }
        }
    }
}

/// A topic's schema as its publishes are checked: its settings and the revisions a message may
/// match (between the settings' bounds), newest first, compiled.
#[derive(Debug)]
pub struct TopicValidator {
    pub settings: SchemaSettings,
    revisions: Vec<(String, Compiled)>,
}

/// What Pub/Sub answers a publish whose message matches no revision (INVALID_ARGUMENT).
pub const SCHEMA_MISMATCH: &str = "Invalid data in message: Message failed schema validation.";

impl TopicValidator {
    /// `revisions` oldest first, as the catalog keeps them. A revision that does not compile
    /// (the catalog holds none: each was compiled before it was committed) matches nothing.
    pub fn new(settings: SchemaSettings, revisions: &[SchemaRevision]) -> TopicValidator {
        let revisions = revisions
            .iter()
            .rev()
            .filter_map(|revision| {
                let compiled = Compiled::new(revision.schema_type, &revision.definition).ok()?;
                Some((revision.revision_id.clone(), compiled))
            })
            .collect();
        TopicValidator { settings, revisions }
    }

    /// The newest revision `data` matches, or why it matches none.
    pub fn check(&self, data: &[u8]) -> Result<&str, String> {
        if self.revisions.is_empty() {
            return Err(format!(
                "{SCHEMA_MISMATCH} The topic's schema {} has no revision to match",
                self.settings.schema
            ));
        }
        let mut why = String::new();
        for (revision_id, compiled) in &self.revisions {
            match compiled.check(self.settings.encoding, data) {
                Ok(()) => return Ok(revision_id),
                Err(error) if why.is_empty() => why = error,
                Err(_) => {}
            }
        }
        Err(format!("{SCHEMA_MISMATCH} {why}"))
    }

    /// The attributes Pub/Sub adds to a message that matched `revision_id`, its schema named
    /// `schema_name` (in full).
    pub fn attributes(&self, schema_name: &str, revision_id: &str) -> [(String, String); 3] {
        [
            ("googclient_schemaencoding".to_owned(), self.settings.encoding.name().to_owned()),
            ("googclient_schemaname".to_owned(), schema_name.to_owned()),
            ("googclient_schemarevisionid".to_owned(), revision_id.to_owned()),
        ]
    }
}

/// A datum's bytes, read by apache-avro, remembering whether it read past their end: its
/// decoder takes the end of the input inside a string as a null, and at a union as its first
/// branch, so a cut datum would decode.
struct Starving<'a> {
    rest: &'a [u8],
    starved: bool,
}

impl std::io::Read for Starving<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        self.starved |= buffer.len() > self.rest.len();
        let count = buffer.len().min(self.rest.len());
        buffer[..count].copy_from_slice(&self.rest[..count]);
        self.rest = &self.rest[count..];
        Ok(count)
    }
}

/// A Protocol Buffer definition's first message type, compiled with protox (its imports may be
/// Google's well-known types only).
fn compile_protocol_buffer(definition: &str) -> Result<MessageDescriptor, String> {
    let invalid = |error: &dyn std::fmt::Display| format!("Invalid Protocol Buffer schema: {error}");
    let file = protox::file::File::from_source(PROTOCOL_BUFFER_FILE, definition).map_err(|e| invalid(&e))?;
    let mut resolver = protox::file::ChainFileResolver::new();
    resolver.add(OneFile(file));
    resolver.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.open_file(PROTOCOL_BUFFER_FILE).map_err(|e| invalid(&e))?;
    let pool = compiler.descriptor_pool();
    let file = pool
        .get_file_by_name(PROTOCOL_BUFFER_FILE)
        .ok_or_else(|| invalid(&"the definition was not compiled"))?;
    let first = file.messages().next();
    first.ok_or_else(|| invalid(&"the definition has no message type"))
}

/// The one file a definition is.
struct OneFile(protox::file::File);

impl protox::file::FileResolver for OneFile {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        match name == PROTOCOL_BUFFER_FILE {
            true => Ok(self.0.clone()),
            false => Err(protox::Error::file_not_found(name)),
        }
    }
}

/// The named types of `schema`, which its references name.
fn avro_names(schema: &AvroSchema) -> Result<HashMap<Name, &AvroSchema>, String> {
    let resolved =
        apache_avro::schema::ResolvedSchema::try_from(schema).map_err(|error| error.to_string())?;
    Ok(resolved.get_names().clone())
}

/// Whether `json` is a datum of `schema` in Avro's JSON encoding (the Avro specification,
/// "JSON Encoding"): a union's value other than null is an object of one member named by its
/// branch's type; bytes and fixed are strings of code points below 256; a record's missing
/// field takes its default.
fn check_avro_json(
    json: &Json,
    schema: &AvroSchema,
    names: &HashMap<Name, &AvroSchema>,
    depth: usize,
) -> Result<(), String> {
    if depth > SCHEMA_JSON_DEPTH_MAX {
        return Err(format!("the JSON datum nests deeper than {SCHEMA_JSON_DEPTH_MAX}"));
    }
    let mismatch = || Err(format!("{json} is not a {}", avro_type_name(schema)));
    let deeper = depth + 1;
    match (schema, json) {
        (AvroSchema::Null, Json::Null) | (AvroSchema::Boolean, Json::Bool(_)) => Ok(()),
        (AvroSchema::Int | AvroSchema::Date | AvroSchema::TimeMillis, Json::Number(number)) => {
            match number.as_i64().and_then(|value| i32::try_from(value).ok()) {
                Some(_) => Ok(()),
                None => mismatch(),
            }
        }
        (
            AvroSchema::Long
            | AvroSchema::TimeMicros
            | AvroSchema::TimestampMillis
            | AvroSchema::TimestampMicros
            | AvroSchema::TimestampNanos
            | AvroSchema::LocalTimestampMillis
            | AvroSchema::LocalTimestampMicros
            | AvroSchema::LocalTimestampNanos,
            Json::Number(number),
        ) => match number.as_i64() {
            Some(_) => Ok(()),
            None => mismatch(),
        },
        (AvroSchema::Float | AvroSchema::Double, Json::Number(_)) => Ok(()),
        (AvroSchema::String | AvroSchema::Uuid, Json::String(_)) => Ok(()),
        (AvroSchema::Bytes | AvroSchema::BigDecimal, Json::String(text)) => bytes_of(text).map(drop),
        (AvroSchema::Decimal(decimal), Json::String(_)) => {
            check_avro_json(json, &decimal.inner, names, deeper)
        }
        (AvroSchema::Fixed(fixed), Json::String(text)) => match bytes_of(text)? == fixed.size {
            true => Ok(()),
            false => mismatch(),
        },
        // A duration is a fixed of 12 bytes (three little-endian u32s).
        (AvroSchema::Duration, Json::String(text)) => match bytes_of(text)? == 12 {
            true => Ok(()),
            false => mismatch(),
        },
        (AvroSchema::Enum(schema), Json::String(symbol)) if schema.symbols.contains(symbol) => Ok(()),
        (AvroSchema::Array(array), Json::Array(items)) => {
            items.iter().try_for_each(|item| check_avro_json(item, &array.items, names, deeper))
        }
        (AvroSchema::Map(map), Json::Object(members)) => {
            members.values().try_for_each(|value| check_avro_json(value, &map.types, names, deeper))
        }
        (AvroSchema::Record(record), Json::Object(members)) => {
            if let Some(unknown) = members.keys().find(|key| !record.lookup.contains_key(*key)) {
                return Err(format!("the record {} has no field '{unknown}'", record.name));
            }
            for field in &record.fields {
                match members.get(&field.name) {
                    Some(value) => check_avro_json(value, &field.schema, names, deeper)
                        .map_err(|error| format!("field '{}': {error}", field.name))?,
                    None if field.default.is_some() => {}
                    None => {
                        return Err(format!("the record {} misses its field '{}'", record.name, field.name))
                    }
                }
            }
            Ok(())
        }
        (AvroSchema::Union(union), Json::Null) if union.variants().contains(&AvroSchema::Null) => Ok(()),
        (AvroSchema::Union(union), Json::Object(members)) if members.len() == 1 => {
            let (branch, value) = members.iter().next().expect("one member");
            let variant = union.variants().iter().find(|variant| avro_type_name(variant) == *branch);
            match variant {
                Some(variant) => check_avro_json(value, variant, names, deeper),
                None => Err(format!("the union has no branch '{branch}'")),
            }
        }
        (AvroSchema::Ref { name }, _) => match names.get(name) {
            Some(named) => check_avro_json(json, named, names, deeper),
            None => Err(format!("the schema names an unknown type {name}")),
        },
        _ => mismatch(),
    }
}

/// How many bytes a JSON string of code points below 256 stands for (Avro's JSON bytes).
fn bytes_of(text: &str) -> Result<usize, String> {
    match text.chars().all(|character| (character as u32) < 256) {
        true => Ok(text.chars().count()),
        false => Err("a bytes value has a code point above 255".to_owned()),
    }
}

/// A type's name as a union's JSON branch names it: a named type's full name, else its type.
fn avro_type_name(schema: &AvroSchema) -> String {
    match schema {
        AvroSchema::Record(record) => record.name.fullname(None),
        AvroSchema::Enum(named) => named.name.fullname(None),
        AvroSchema::Fixed(fixed) => fixed.name.fullname(None),
        AvroSchema::Ref { name } => name.fullname(None),
        AvroSchema::Decimal(decimal) => avro_type_name(&decimal.inner),
        other => {
            let kind = apache_avro::schema::SchemaKind::from(other);
            format!("{kind:?}").to_lowercase()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AVRO: &str = r#"{"type": "record", "name": "State", "namespace": "utilities",
        "fields": [
            {"name": "name", "type": "string"},
            {"name": "post_abbr", "type": "string"},
            {"name": "population", "type": ["null", "long"], "default": null}
        ]}"#;

    const PROTOCOL_BUFFER: &str = r#"syntax = "proto3";
        message State {
          string name = 1;
          string post_abbr = 2;
          int64 population = 3;
        }
        message Unused { bool flag = 1; }"#;

    fn avro_binary(name: &str, abbreviation: &str, population: Option<i64>) -> Vec<u8> {
        use apache_avro::types::Value;
        let schema = AvroSchema::parse_str(AVRO).unwrap();
        let population = match population {
            None => Value::Union(0, Box::new(Value::Null)),
            Some(value) => Value::Union(1, Box::new(Value::Long(value))),
        };
        let value = Value::Record(vec![
            ("name".into(), Value::String(name.into())),
            ("post_abbr".into(), Value::String(abbreviation.into())),
            ("population".into(), population),
        ]);
        apache_avro::to_avro_datum(&schema, value).unwrap()
    }

    #[test]
    fn avro_messages_are_checked_in_both_encodings() {
        let compiled = Compiled::new(SchemaType::Avro, AVRO).unwrap();
        for good in [
            r#"{"name": "Alaska", "post_abbr": "AK"}"#,
            r#"{"name": "Alaska", "post_abbr": "AK", "population": null}"#,
            r#"{"name": "Alaska", "post_abbr": "AK", "population": {"long": 733391}}"#,
        ] {
            assert_eq!(compiled.check(SchemaEncoding::Json, good.as_bytes()), Ok(()), "{good}");
        }
        for bad in [
            r#"{"name": "Alaska"}"#,
            r#"{"name": 3, "post_abbr": "AK"}"#,
            r#"{"name": "Alaska", "post_abbr": "AK", "population": 733391}"#,
            r#"{"name": "Alaska", "post_abbr": "AK", "capital": "Juneau"}"#,
            r#"not json"#,
        ] {
            assert!(compiled.check(SchemaEncoding::Json, bad.as_bytes()).is_err(), "{bad}");
        }
        let binary = avro_binary("Alaska", "AK", Some(733391));
        assert_eq!(compiled.check(SchemaEncoding::Binary, &binary), Ok(()));
        assert_eq!(compiled.check(SchemaEncoding::Binary, &avro_binary("Ohio", "OH", None)), Ok(()));
        for cut in 0..binary.len() {
            assert!(compiled.check(SchemaEncoding::Binary, &binary[..cut]).is_err(), "a datum cut at {cut}");
        }
        let mut longer = binary.clone();
        longer.push(0);
        assert!(compiled.check(SchemaEncoding::Binary, &longer).is_err(), "bytes after the datum");
        assert!(compiled.check(SchemaEncoding::Binary, b"{\"name\": \"Alaska\"}").is_err());
    }

    #[test]
    fn protocol_buffer_messages_are_checked_against_the_first_message_in_both_encodings() {
        let compiled = Compiled::new(SchemaType::ProtocolBuffer, PROTOCOL_BUFFER).unwrap();
        let Compiled::ProtocolBuffer(descriptor) = &compiled else { panic!("not a protocol buffer") };
        assert_eq!(descriptor.name(), "State");
        let good = r#"{"name": "Alaska", "postAbbr": "AK", "population": "733391"}"#;
        assert_eq!(compiled.check(SchemaEncoding::Json, good.as_bytes()), Ok(()));
        for bad in [r#"{"name": 3}"#, r#"{"flag": true}"#, "not json", r#"{"name": "A"} trailing"#] {
            assert!(compiled.check(SchemaEncoding::Json, bad.as_bytes()).is_err(), "{bad}");
        }
        // Field 1 (a string) "Alaska", field 3 (an int64) 5.
        let binary = [&[0x0a, 6][..], b"Alaska", &[0x18, 5]].concat();
        assert_eq!(compiled.check(SchemaEncoding::Binary, &binary), Ok(()));
        assert!(compiled.check(SchemaEncoding::Binary, &binary[..4]).is_err(), "a cut message");
        // Field 1 as a varint: the wrong wire type for a string.
        assert!(compiled.check(SchemaEncoding::Binary, &[0x08, 1]).is_err());
    }

    /// A message matches if it matches any revision between the bounds; the newest it matches
    /// is the one its attribute names.
    #[test]
    fn a_topics_message_matches_any_revision_between_its_bounds() {
        let revision = |revision_id: &str, definition: &str| SchemaRevision {
            revision_id: revision_id.to_owned(),
            schema_type: SchemaType::Avro,
            definition: definition.to_owned(),
            created_ms: 1,
        };
        let older = revision("0000000a", AVRO);
        let newer = revision(
            "0000000b",
            r#"{"type": "record", "name": "Count", "fields": [{"name": "n", "type": "int"}]}"#,
        );
        let settings = SchemaSettings {
            schema: "states".to_owned(),
            encoding: SchemaEncoding::Json,
            first_revision_id: String::new(),
            last_revision_id: String::new(),
        };
        let both = TopicValidator::new(settings.clone(), &[older.clone(), newer.clone()]);
        assert_eq!(both.check(br#"{"n": 3}"#), Ok("0000000b"));
        assert_eq!(both.check(br#"{"name": "Ohio", "post_abbr": "OH"}"#), Ok("0000000a"));
        assert!(both.check(br#"{"n": "three"}"#).unwrap_err().starts_with(SCHEMA_MISMATCH));
        let newer_only = TopicValidator::new(settings.clone(), &[newer]);
        assert!(newer_only.check(br#"{"name": "Ohio", "post_abbr": "OH"}"#).is_err());
        assert!(TopicValidator::new(settings, &[]).check(b"{}").is_err(), "a deleted schema matches nothing");
        let attributes = both.attributes("projects/p/schemas/states", "0000000b");
        assert_eq!(attributes[0], ("googclient_schemaencoding".to_owned(), "JSON".to_owned()));
    }

    #[test]
    fn definitions_that_are_no_schema_are_refused() {
        assert!(Compiled::new(SchemaType::Avro, "{\"type\": \"recrod\"}").is_err());
        assert!(Compiled::new(SchemaType::Avro, "not json").is_err());
        assert!(Compiled::new(SchemaType::ProtocolBuffer, "message {").is_err());
        assert!(Compiled::new(SchemaType::ProtocolBuffer, "syntax = \"proto3\";").is_err(), "no message");
        assert!(Compiled::new(
            SchemaType::ProtocolBuffer,
            "syntax = \"proto3\"; import \"x.proto\"; message A {}"
        )
        .is_err());
    }
}
