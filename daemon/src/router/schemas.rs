//! Pub/Sub's schemas: created, revised, rolled back, deleted and read; and the schema
//! settings of topics. A definition is compiled (`crate::schema::Compiled`) before it is
//! committed, so the catalog holds only schemas a publish can be checked against.

use super::*;
use crate::catalog::schemas::{
    SchemaEncoding, SchemaEntry, SchemaRecord, SchemaRevision, SchemaSettings, SchemaType, DELETED_SCHEMA,
};

/// How many schemas the catalog holds.
pub const SCHEMAS_MAX: usize = 10_000;
/// How many revisions a schema keeps (Pub/Sub's limit): a commit beyond them is refused until
/// one is deleted.
pub const SCHEMA_REVISIONS_MAX: usize = 20;
/// The largest definition a revision holds (Pub/Sub's limit, 300 KB).
pub const SCHEMA_DEFINITION_BYTES_MAX: usize = 300_000;

/// A topic's schema as a publish checks it: its settings and the revisions between their
/// bounds, oldest first (none when its schema was deleted: every message is refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSchema {
    pub settings: SchemaSettings,
    pub revisions: Vec<SchemaRevision>,
}

impl<S: Storage> Router<S> {
    /// Schema `name`, whole.
    pub fn schema(&self, name: &str) -> Result<SchemaRecord, ControlError> {
        validate_name("schema", name)?;
        let state = self.state.borrow();
        let schema = state.schemas.get(name).cloned();
        schema.ok_or_else(|| ControlError::not_found(format!("schema '{name}'")))
    }

    /// One page of the schemas that `visible` shows, as `list_topics` pages.
    pub fn list_schemas(
        &self,
        page_size: u32,
        page_token: &str,
        visible: impl Fn(&str) -> bool,
    ) -> Page<SchemaRecord> {
        let state = self.state.borrow();
        let after = (std::ops::Bound::Excluded(page_token), std::ops::Bound::Unbounded);
        let schemas = state.schemas.range::<str, _>(after).filter(|(name, _)| visible(name));
        page(schemas.map(|(_, schema)| schema.clone()), page_size, |schema| &schema.name)
    }

    /// A new schema of one revision, refused if its definition is not one of `schema_type`.
    pub async fn create_schema(
        &self,
        name: &str,
        schema_type: SchemaType,
        definition: &str,
    ) -> Result<SchemaRecord, ControlError> {
        validate_name("schema", name)?;
        let revision = new_revision(schema_type, definition, &[])?;
        let _reservation = self.reserve_name(&format!("schema/{name}"))?;
        if self.state.borrow().schemas.contains_key(name) {
            return Err(ControlError::already_exists(format!("schema '{name}'")));
        }
        if self.state.borrow().schemas.len() >= SCHEMAS_MAX {
            return Err(ControlError::failed_precondition(format!(
                "the catalog holds {SCHEMAS_MAX} schemas (SCHEMAS_MAX)"
            )));
        }
        self.propose(CatalogEntry::Schema(SchemaEntry::Committed {
            name: name.to_owned(),
            creates: true,
            revision,
        }))
        .await?;
        self.schema(name)
    }

    /// A revision added to schema `name`: `definition`, or, for a rollback, that of its revision
    /// `rollback_to`.
    pub async fn commit_schema(
        &self,
        name: &str,
        schema_type: SchemaType,
        definition: &str,
    ) -> Result<SchemaRecord, ControlError> {
        let _update = self.update_permit().await?;
        let schema = self.schema(name)?;
        if schema.revisions.len() >= SCHEMA_REVISIONS_MAX {
            return Err(ControlError::failed_precondition(format!(
                "schema '{name}' has {SCHEMA_REVISIONS_MAX} revisions (SCHEMA_REVISIONS_MAX): delete one first"
            )));
        }
        let revision = new_revision(schema_type, definition, &schema.revisions)?;
        let entry =
            CatalogEntry::Schema(SchemaEntry::Committed { name: name.to_owned(), creates: false, revision });
        if self.propose(entry).await? == Applied::Updated(false) {
            return Err(ControlError::not_found(format!("schema '{name}' (deleted during the commit)")));
        }
        self.schema(name)
    }

    /// A new revision of schema `name` with the definition of its revision `revision_id`.
    pub async fn rollback_schema(&self, name: &str, revision_id: &str) -> Result<SchemaRecord, ControlError> {
        let schema = self.schema(name)?;
        let revision = revision_of(&schema, revision_id)?;
        self.commit_schema(name, revision.schema_type, &revision.definition).await
    }

    /// Deletes revision `revision_id` of schema `name`, never its only one.
    pub async fn delete_schema_revision(
        &self,
        name: &str,
        revision_id: &str,
    ) -> Result<SchemaRecord, ControlError> {
        let _update = self.update_permit().await?;
        let schema = self.schema(name)?;
        revision_of(&schema, revision_id)?;
        if schema.revisions.len() == 1 {
            return Err(ControlError::failed_precondition(format!(
                "revision {revision_id} is schema '{name}''s only one: delete the schema instead"
            )));
        }
        let revision_id = revision_id.to_owned();
        let entry = CatalogEntry::Schema(SchemaEntry::RevisionDeleted { name: name.to_owned(), revision_id });
        if self.propose(entry).await? == Applied::Updated(false) {
            return Err(ControlError::not_found(format!("schema '{name}' (changed during the deletion)")));
        }
        self.schema(name)
    }

    /// Deletes schema `name`: its topics keep their settings, naming `DELETED_SCHEMA`.
    pub async fn delete_schema(&self, name: &str) -> Result<(), ControlError> {
        self.schema(name)?;
        match self.propose(CatalogEntry::Schema(SchemaEntry::Deleted { name: name.to_owned() })).await? {
            Applied::Updated(false) => Err(ControlError::not_found(format!("schema '{name}'"))),
            _ => Ok(()),
        }
    }

    /// Topic `topic`'s schema settings from now on (`None`: none), refused unless they name a
    /// schema and revisions it has, the first not after the last.
    pub async fn set_topic_schema(
        &self,
        topic: &str,
        settings: Option<SchemaSettings>,
    ) -> Result<(), ControlError> {
        let _update = self.update_permit().await?;
        let topic_id = self.topic_record(topic)?.id;
        if let Some(settings) = &settings {
            self.check_schema_settings(settings)?;
        }
        let entry = CatalogEntry::Schema(SchemaEntry::TopicSet { topic_id, settings });
        if self.propose(entry).await? == Applied::Updated(false) {
            return Err(ControlError::not_found(format!("topic '{topic}' (deleted meanwhile)")));
        }
        Ok(())
    }

    /// Topic `topic`'s schema, if it has one, with the revisions a message may match.
    pub fn topic_schema(&self, topic: &str) -> Result<Option<TopicSchema>, ControlError> {
        let topic_id = self.topic_record(topic)?.id;
        let state = self.state.borrow();
        let Some(settings) = state.topic_schemas.get(&topic_id).cloned() else { return Ok(None) };
        let revisions = match state.schemas.get(&settings.schema) {
            Some(schema) if settings.schema != DELETED_SCHEMA => {
                revision_window(schema, &settings).map(<[SchemaRevision]>::to_vec).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        Ok(Some(TopicSchema { settings, revisions }))
    }

    /// Whether `settings` name a schema and revisions it has, the first not after the last.
    pub fn check_schema_settings(&self, settings: &SchemaSettings) -> Result<(), ControlError> {
        let schema = self.schema(&settings.schema)?;
        revision_window(&schema, settings).map(drop)
    }

    /// The schema settings of each of `topics` (by name), where it has any (what GetTopic and
    /// ListTopics show).
    pub fn topics_schema_settings(&self, topics: &[String]) -> Vec<Option<SchemaSettings>> {
        let state = self.state.borrow();
        let settings_of = |name: &String| {
            let topic = state.topics.get(name)?;
            state.topic_schemas.get(&topic.id).cloned()
        };
        topics.iter().map(settings_of).collect()
    }
}

/// Schema `schema`'s revision `revision_id`.
fn revision_of<'a>(schema: &'a SchemaRecord, revision_id: &str) -> Result<&'a SchemaRevision, ControlError> {
    let revision = schema.revisions.iter().find(|revision| revision.revision_id == revision_id);
    revision
        .ok_or_else(|| ControlError::not_found(format!("revision {revision_id} of schema '{}'", schema.name)))
}

/// The revisions of `schema` between `settings`' bounds (an empty bound is none).
fn revision_window<'a>(
    schema: &'a SchemaRecord,
    settings: &SchemaSettings,
) -> Result<&'a [SchemaRevision], ControlError> {
    let position = |revision_id: &str, default: usize| match revision_id.is_empty() {
        true => Ok(default),
        false => revision_of(schema, revision_id)
            .map(|found| schema.revisions.iter().position(|revision| revision == found).expect("listed")),
    };
    let first = position(&settings.first_revision_id, 0)?;
    let last = position(&settings.last_revision_id, schema.revisions.len() - 1)?;
    if first > last {
        return Err(ControlError::invalid_argument(format!(
            "first revision {} comes after last revision {}",
            settings.first_revision_id, settings.last_revision_id
        )));
    }
    Ok(&schema.revisions[first..=last])
}

/// A revision of `definition`, checked, with an id none of `taken` has.
fn new_revision(
    schema_type: SchemaType,
    definition: &str,
    taken: &[SchemaRevision],
) -> Result<SchemaRevision, ControlError> {
    if definition.len() > SCHEMA_DEFINITION_BYTES_MAX {
        return Err(ControlError::invalid_argument(format!(
            "a schema's definition is {} bytes, above {SCHEMA_DEFINITION_BYTES_MAX} (SCHEMA_DEFINITION_BYTES_MAX)",
            definition.len()
        )));
    }
    crate::schema::Compiled::new(schema_type, definition).map_err(ControlError::invalid_argument)?;
    let revision_id = loop {
        let revision_id = revision_id();
        if !taken.iter().any(|revision| revision.revision_id == revision_id) {
            break revision_id;
        }
    };
    Ok(SchemaRevision { revision_id, schema_type, definition: definition.to_owned(), created_ms: wall_ms() })
}

/// A revision id as Pub/Sub's: eight hex digits, random.
fn revision_id() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 4];
    ring::rand::SystemRandom::new().fill(&mut bytes).expect("the system's random bytes");
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The encoding of a topic's settings as Pub/Sub numbers it, if it is one.
pub fn schema_encoding(number: i32) -> Option<SchemaEncoding> {
    u8::try_from(number).ok().and_then(SchemaEncoding::from_number)
}
