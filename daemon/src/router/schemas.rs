//! Pub/Sub's schemas: created, revised, rolled back, deleted and read; and the schema
//! settings of topics. A definition is compiled (`crate::schema::Compiled`) before it is
//! committed, so the catalog holds only schemas a publish can be checked against.

use super::*;
use crate::catalog::entry::SHARD_UNPLACED;
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
        // A topic whose last bound is open now takes the new revision too.
        self.push_schema_users(self.schema_users(name)).await?;
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
        self.push_schema_users(self.schema_users(name)).await?;
        self.schema(name)
    }

    /// Deletes schema `name`: its topics keep their settings, naming `DELETED_SCHEMA`.
    pub async fn delete_schema(&self, name: &str) -> Result<(), ControlError> {
        self.schema(name)?;
        // Read before: once deleted, the topics' settings name `DELETED_SCHEMA`.
        let users = self.schema_users(name);
        match self.propose(CatalogEntry::Schema(SchemaEntry::Deleted { name: name.to_owned() })).await? {
            Applied::Updated(false) => Err(ControlError::not_found(format!("schema '{name}'"))),
            // Their messages are refused from now on, as none matches a deleted schema.
            _ => self.push_schema_users(users).await,
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
        let had = self.state.borrow().topic_schemas.contains_key(&topic_id);
        let entry = CatalogEntry::Schema(SchemaEntry::TopicSet { topic_id, settings });
        if self.propose(entry).await? == Applied::Updated(false) {
            return Err(ControlError::not_found(format!("topic '{topic}' (deleted meanwhile)")));
        }
        self.push_topic_schema(topic_id, had).await
    }

    /// Topic `topic`'s schema, if it has one, with the revisions a message may match.
    pub fn topic_schema(&self, topic: &str) -> Result<Option<TopicSchema>, ControlError> {
        let topic_id = self.topic_record(topic)?.id;
        Ok(self.topic_schema_of(topic_id))
    }

    /// Topic `topic_id`'s schema, if it has one, with the revisions a message may match.
    fn topic_schema_of(&self, topic_id: TopicId) -> Option<TopicSchema> {
        let state = self.state.borrow();
        let settings = state.topic_schemas.get(&topic_id).cloned()?;
        let revisions = match state.schemas.get(&settings.schema) {
            Some(schema) if settings.schema != DELETED_SCHEMA => {
                revision_window(schema, &settings).map(<[SchemaRevision]>::to_vec).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        Some(TopicSchema { settings, revisions })
    }

    /// Follows an attach (or promotion) of unit `unit` on `shard` with its topic's schema, when
    /// it has one (`ControlRequest::SetTopicSchema`): a unit of a topic without one is sent
    /// nothing more than before. A unit the catalog does not name yet (a topic or source being
    /// created) has it pushed once it does (`set_topic_schema`, `add_source`).
    pub(super) async fn push_unit_schema(&self, shard: ShardId, unit: TopicId) -> Result<(), ControlError> {
        let topic_id = {
            let state = self.state.borrow();
            let source =
                || state.sources.values().find(|source| source.id == unit).map(|source| source.topic_id);
            state.topic_by_id(unit).map(|topic| topic.id).or_else(source)
        };
        let Some(schema) = topic_id.and_then(|topic_id| self.topic_schema_of(topic_id)) else {
            return Ok(());
        };
        let request = ControlRequest::SetTopicSchema { topic_id: unit, schema: Some(schema) };
        self.call_forwarder_only(shard, request).await.map(drop)
    }

    /// Pushes topic `topic_id`'s schema, as the catalog now holds it, to every replica of each
    /// of its units: after a change of its settings or of its schema. Without a schema, only
    /// when it had one (`cleared`), so that a topic that never had one is sent nothing. A
    /// replica whose node is unreachable gets it when it is attached again (its recovery).
    pub(super) async fn push_topic_schema(
        &self,
        topic_id: TopicId,
        cleared: bool,
    ) -> Result<(), ControlError> {
        let schema = self.topic_schema_of(topic_id);
        if schema.is_none() && !cleared {
            return Ok(());
        }
        let replicas: Vec<(TopicId, ShardId)> = {
            let state = self.state.borrow();
            let Some(topic) = state.topic_by_id(topic_id) else { return Ok(()) };
            let own = topic.replica_shards().into_iter().map(|shard| (topic.id, shard));
            let sources = state
                .sources_of(topic_id)
                .flat_map(|source| source.replica_shards().into_iter().map(|shard| (source.id, shard)));
            own.chain(sources).filter(|(_, shard)| *shard != SHARD_UNPLACED).collect()
        };
        for (unit, shard) in replicas {
            let request = ControlRequest::SetTopicSchema { topic_id: unit, schema: schema.clone() };
            match self.call_forwarder_only(shard, request).await {
                Ok(_) => {}
                Err(error) if error.is_unavailable() => crate::log_warn!(
                    "ringpostd: topic {topic_id:x}'s schema not pushed to shard {shard} now: {error}"
                ),
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Pushes the schema of every topic whose settings name schema `name` (`push_topic_schema`).
    async fn push_schema_users(&self, topics: Vec<TopicId>) -> Result<(), ControlError> {
        for topic_id in topics {
            self.push_topic_schema(topic_id, true).await?;
        }
        Ok(())
    }

    /// The topics whose settings name schema `name`.
    fn schema_users(&self, name: &str) -> Vec<TopicId> {
        let state = self.state.borrow();
        let users = state.topic_schemas.iter().filter(|(_, settings)| settings.schema == name);
        users.map(|(topic_id, _)| *topic_id).collect()
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
            let topic = state.topics.get(name.as_str())?;
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
