//! Pub/Sub's schemas in the catalog: each schema's revisions, and the schema settings of the
//! topics that have one, with their entries (`SchemaEntry`, kinds 31 to 34) and codec. A node of the version
//! before refuses these kinds as unknown, so it never serves a topic with a schema as one
//! without; a topic without a schema writes none of them, so its entries are the bytes of the
//! version before.

use crate::codec::{DecodeResult, Decoder, Encoder};
use crate::ids::TopicId;

/// A revision committed to a schema (a creation is its first revision, a rollback a new
/// revision repeating an older one's definition): `SchemaCommitted`.
pub const KIND_SCHEMA_COMMITTED: u8 = 31;
/// One revision of a schema deleted, never its last: `SchemaRevisionDeleted`.
pub const KIND_SCHEMA_REVISION_DELETED: u8 = 32;
/// A schema deleted with every revision: `SchemaDeleted`.
pub const KIND_SCHEMA_DELETED: u8 = 33;
/// A topic's schema settings set or cleared: `TopicSchemaSet`.
pub const KIND_TOPIC_SCHEMA_SET: u8 = 34;

/// The schema name Pub/Sub shows in the settings of a topic whose schema was deleted.
pub const DELETED_SCHEMA: &str = "_deleted-schema_";

/// A schema's type, numbered as Pub/Sub's `Schema.Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaType {
    ProtocolBuffer = 1,
    Avro = 2,
}

impl SchemaType {
    pub fn from_number(number: u8) -> Option<SchemaType> {
        match number {
            1 => Some(SchemaType::ProtocolBuffer),
            2 => Some(SchemaType::Avro),
            _ => None,
        }
    }
}

/// How a topic's messages encode their data, numbered as Pub/Sub's `Encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaEncoding {
    Json = 1,
    Binary = 2,
}

impl SchemaEncoding {
    pub fn from_number(number: u8) -> Option<SchemaEncoding> {
        match number {
            1 => Some(SchemaEncoding::Json),
            2 => Some(SchemaEncoding::Binary),
            _ => None,
        }
    }

    /// As Pub/Sub writes it in the `googclient_schemaencoding` attribute.
    pub fn name(self) -> &'static str {
        match self {
            SchemaEncoding::Json => "JSON",
            SchemaEncoding::Binary => "BINARY",
        }
    }
}

/// One revision of a schema, as its leader decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaRevision {
    /// Eight lowercase hex digits, unique within the schema.
    pub revision_id: String,
    pub schema_type: SchemaType,
    pub definition: String,
    /// Milliseconds since the Unix epoch.
    pub created_ms: u64,
}

/// A schema: its revisions, oldest first; never none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaRecord {
    pub name: String,
    pub revisions: Vec<SchemaRevision>,
}

impl SchemaRecord {
    /// Its newest revision, which a GetSchema without a revision answers.
    pub fn latest(&self) -> &SchemaRevision {
        self.revisions.last().expect("a schema has a revision")
    }
}

/// A topic's schema settings, as Pub/Sub's `SchemaSettings`: an empty revision id is no bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaSettings {
    pub schema: String,
    pub encoding: SchemaEncoding,
    pub first_revision_id: String,
    pub last_revision_id: String,
}

/// The schemas' entries of the catalog (`CatalogEntry::Schema`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaEntry {
    /// A revision of schema `name`: its first when `creates` (applied only if no schema has
    /// the name), else a revision added to it (applied only while it lives, and only with a
    /// revision id it does not have).
    Committed { name: String, creates: bool, revision: SchemaRevision },
    /// One revision of schema `name` deleted: applied only if it has another.
    RevisionDeleted { name: String, revision_id: String },
    /// Schema `name` deleted: the topics using it keep their settings, naming
    /// `DELETED_SCHEMA` (as Pub/Sub shows them).
    Deleted { name: String },
    /// Topic `topic_id`'s schema settings from now on (`None`: it has none). Applied only
    /// while the topic lives.
    TopicSet { topic_id: TopicId, settings: Option<SchemaSettings> },
}

impl SchemaEntry {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            SchemaEntry::Committed { name, creates, revision } => encode_committed(name, *creates, revision),
            SchemaEntry::RevisionDeleted { name, revision_id } => {
                Encoder::new(KIND_SCHEMA_REVISION_DELETED).str(name).str(revision_id).0.clone()
            }
            SchemaEntry::Deleted { name } => Encoder::new(KIND_SCHEMA_DELETED).str(name).0.clone(),
            SchemaEntry::TopicSet { topic_id, settings } => encode_topic_schema(*topic_id, settings.as_ref()),
        }
    }

    /// The entry of kind `kind` (one of the schemas'), from the byte after it.
    pub fn decode(kind: u8, d: &mut Decoder) -> DecodeResult<SchemaEntry> {
        decode(kind, d)
    }
}

impl std::fmt::Display for SchemaEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SchemaEntry::Committed { name, revision, .. } => {
                write!(f, "commit revision {} of schema '{name}'", revision.revision_id)
            }
            SchemaEntry::RevisionDeleted { name, revision_id } => {
                write!(f, "delete revision {revision_id} of schema '{name}'")
            }
            SchemaEntry::Deleted { name } => write!(f, "delete schema '{name}'"),
            SchemaEntry::TopicSet { topic_id, settings: Some(settings) } => {
                write!(f, "topic {topic_id:x}'s schema is '{}'", settings.schema)
            }
            SchemaEntry::TopicSet { topic_id, settings: None } => {
                write!(f, "topic {topic_id:x} has no schema")
            }
        }
    }
}

/// `KIND_SCHEMA_COMMITTED`: whether it creates the schema, its name, then the revision.
fn encode_committed(name: &str, creates: bool, revision: &SchemaRevision) -> Vec<u8> {
    let mut encoder = Encoder::new(KIND_SCHEMA_COMMITTED);
    encoder
        .bool(creates)
        .str(name)
        .str(&revision.revision_id)
        .u8(revision.schema_type as u8)
        .str(&revision.definition)
        .u64(revision.created_ms);
    encoder.0
}

/// `KIND_TOPIC_SCHEMA_SET`: the topic, whether it has settings, and them (empty when not).
fn encode_topic_schema(topic_id: TopicId, settings: Option<&SchemaSettings>) -> Vec<u8> {
    let mut encoder = Encoder::new(KIND_TOPIC_SCHEMA_SET);
    encoder.u64(topic_id.get()).bool(settings.is_some());
    if let Some(settings) = settings {
        encoder
            .str(&settings.schema)
            .u8(settings.encoding as u8)
            .str(&settings.first_revision_id)
            .str(&settings.last_revision_id);
    }
    encoder.0
}

/// The schemas' entries, from the byte after their kind.
fn decode(kind: u8, d: &mut Decoder) -> DecodeResult<SchemaEntry> {
    Ok(match kind {
        KIND_SCHEMA_COMMITTED => {
            let creates = d.bool()?;
            let name = named(d.str()?)?;
            let revision = SchemaRevision {
                revision_id: named(d.str()?)?,
                schema_type: SchemaType::from_number(d.u8()?).ok_or("an unknown schema type")?,
                definition: d.str()?,
                created_ms: d.u64()?,
            };
            SchemaEntry::Committed { name, creates, revision }
        }
        KIND_SCHEMA_REVISION_DELETED => {
            SchemaEntry::RevisionDeleted { name: named(d.str()?)?, revision_id: named(d.str()?)? }
        }
        KIND_SCHEMA_DELETED => SchemaEntry::Deleted { name: named(d.str()?)? },
        KIND_TOPIC_SCHEMA_SET => {
            let topic_id = TopicId::new(d.u64()?);
            let settings = match d.bool()? {
                false => None,
                true => Some(SchemaSettings {
                    schema: named(d.str()?)?,
                    encoding: SchemaEncoding::from_number(d.u8()?).ok_or("an unknown schema encoding")?,
                    first_revision_id: d.str()?,
                    last_revision_id: d.str()?,
                }),
            };
            SchemaEntry::TopicSet { topic_id, settings }
        }
        _ => return Err("unknown catalog entry kind"),
    })
}

fn named(name: String) -> DecodeResult<String> {
    if name.is_empty() {
        return Err("a schema entry with an empty name");
    }
    Ok(name)
}
