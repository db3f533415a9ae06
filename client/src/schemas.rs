//! Pub/Sub's schemas over the native protocol: created, read, listed, revised, rolled back,
//! deleted, and definitions and messages checked against them; topics with schema settings.
//! All go to the router, which checks `pubsub.schemas.*` (a daemon from before schemas refuses
//! these commands as unknown).

use crate::{Client, Result};
use ringpost_wire::messages::{
    CreateTopicWithSchemaRequest, CreateTopicWithSourcesRequest, Empty, GetSchemaRequest, ListSchemasRequest,
    NameRequest, Schema, SchemaList, SchemaRequest, SchemaRevisionRequest, SchemaSettings, Topic,
    TopicWithSchema, UpdateTopicSchemaRequest, ValidateMessageRequest,
};
use ringpost_wire::Command;

/// How many schemas or revisions a page of `list_schemas` and `list_schema_revisions` asks.
const SCHEMAS_PAGE_SIZE: u32 = 1000;

/// A schema's type, as Pub/Sub numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaType {
    ProtocolBuffer = 1,
    Avro = 2,
}

impl SchemaType {
    /// `avro` or `protocol-buffer` (also Pub/Sub's `AVRO` and `PROTOCOL_BUFFER`).
    pub fn parse(text: &str) -> Option<SchemaType> {
        match text.to_ascii_lowercase().replace('_', "-").as_str() {
            "avro" => Some(SchemaType::Avro),
            "protocol-buffer" | "protobuf" => Some(SchemaType::ProtocolBuffer),
            _ => None,
        }
    }

    /// Its number on the wire (`Schema::schema_type`).
    pub fn number(self) -> u8 {
        self as u8
    }

    /// The type a number names, as `parse` spells it.
    pub fn name_of(number: u8) -> &'static str {
        match number {
            1 => "protocol-buffer",
            2 => "avro",
            _ => "unknown",
        }
    }
}

/// How a message's data is encoded, as Pub/Sub numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaEncoding {
    Json = 1,
    Binary = 2,
}

impl SchemaEncoding {
    /// `json` or `binary` (also upper case).
    pub fn parse(text: &str) -> Option<SchemaEncoding> {
        match text.to_ascii_lowercase().as_str() {
            "json" => Some(SchemaEncoding::Json),
            "binary" => Some(SchemaEncoding::Binary),
            _ => None,
        }
    }

    pub fn number(self) -> u8 {
        self as u8
    }

    /// The encoding a number names, as `parse` spells it.
    pub fn name_of(number: u8) -> &'static str {
        match number {
            1 => "json",
            2 => "binary",
            _ => "unknown",
        }
    }
}

/// A schema's name and, after `@`, the revision it names (Pub/Sub's `name@revision_id`; none:
/// the newest).
pub fn split_revision(name: &str) -> (&str, &str) {
    name.split_once('@').unwrap_or((name, ""))
}

impl Client {
    /// Creates schema `name` with its first revision of `definition`, refused
    /// (`InvalidArgument`) unless the definition is one of `schema_type`.
    pub async fn create_schema(
        &self,
        name: &str,
        schema_type: SchemaType,
        definition: &str,
    ) -> Result<Schema> {
        let request = SchemaRequest {
            name: name.to_owned(),
            schema_type: schema_type.number(),
            definition: definition.to_owned(),
        };
        self.control(Command::CreateSchema, &request).await
    }

    /// A schema's revision: `name`, or `name@revision_id` for one of its revisions; with its
    /// definition when `full`.
    pub async fn get_schema(&self, name: &str, full: bool) -> Result<Schema> {
        let (name, revision_id) = split_revision(name);
        let request = GetSchemaRequest { name: name.to_owned(), revision_id: revision_id.to_owned(), full };
        self.control(Command::GetSchema, &request).await
    }

    /// Every schema the caller may list (each its newest revision), by name, following pages.
    pub async fn list_schemas(&self, full: bool) -> Result<Vec<Schema>> {
        self.schema_pages(Command::ListSchemas, "", full).await
    }

    /// Every revision of schema `name`, newest first, following pages.
    pub async fn list_schema_revisions(&self, name: &str, full: bool) -> Result<Vec<Schema>> {
        self.schema_pages(Command::ListSchemaRevisions, name, full).await
    }

    async fn schema_pages(&self, command: Command, name: &str, full: bool) -> Result<Vec<Schema>> {
        let mut schemas = Vec::new();
        let mut page_token = String::new();
        loop {
            let request =
                ListSchemasRequest { name: name.to_owned(), page_size: SCHEMAS_PAGE_SIZE, page_token, full };
            let page: SchemaList = self.control(command, &request).await?;
            schemas.extend(page.schemas);
            if page.next_page_token.is_empty() {
                return Ok(schemas);
            }
            page_token = page.next_page_token;
        }
    }

    /// Adds a revision of `definition` to schema `name` and returns it.
    pub async fn commit_schema(
        &self,
        name: &str,
        schema_type: SchemaType,
        definition: &str,
    ) -> Result<Schema> {
        let request = SchemaRequest {
            name: name.to_owned(),
            schema_type: schema_type.number(),
            definition: definition.to_owned(),
        };
        self.control(Command::CommitSchema, &request).await
    }

    /// Adds a revision to schema `name` with the definition of its revision `revision_id`.
    pub async fn rollback_schema(&self, name: &str, revision_id: &str) -> Result<Schema> {
        let request = SchemaRevisionRequest { name: name.to_owned(), revision_id: revision_id.to_owned() };
        self.control(Command::RollbackSchema, &request).await
    }

    /// Deletes revision `revision_id` of schema `name` (never its only one) and returns the
    /// schema's newest revision.
    pub async fn delete_schema_revision(&self, name: &str, revision_id: &str) -> Result<Schema> {
        let request = SchemaRevisionRequest { name: name.to_owned(), revision_id: revision_id.to_owned() };
        self.control(Command::DeleteSchemaRevision, &request).await
    }

    /// Deletes schema `name` with every revision; its topics' settings then name
    /// `_deleted-schema_`, and their publishes are refused.
    pub async fn delete_schema(&self, name: &str) -> Result<()> {
        let _: Empty = self.control(Command::DeleteSchema, &NameRequest { name: name.to_owned() }).await?;
        Ok(())
    }

    /// Whether `definition` is one of `schema_type` (`InvalidArgument`, with why, if not).
    pub async fn validate_schema(&self, schema_type: SchemaType, definition: &str) -> Result<()> {
        let request = SchemaRequest {
            name: String::new(),
            schema_type: schema_type.number(),
            definition: definition.to_owned(),
        };
        let _: Empty = self.control(Command::ValidateSchema, &request).await?;
        Ok(())
    }

    /// Whether `message` matches schema `name` (or `name@revision_id`), encoded as `encoding`
    /// (`InvalidArgument`, with why, if not).
    pub async fn validate_message(&self, name: &str, encoding: SchemaEncoding, message: &[u8]) -> Result<()> {
        let (name, revision_id) = split_revision(name);
        let request = ValidateMessageRequest {
            name: name.to_owned(),
            revision_id: revision_id.to_owned(),
            encoding: encoding.number(),
            message: message.to_vec(),
            ..Default::default()
        };
        let _: Empty = self.control(Command::ValidateMessage, &request).await?;
        Ok(())
    }

    /// Whether `message` matches `definition` of `schema_type`, which no schema holds.
    pub async fn validate_message_against(
        &self,
        schema_type: SchemaType,
        definition: &str,
        encoding: SchemaEncoding,
        message: &[u8],
    ) -> Result<()> {
        let request = ValidateMessageRequest {
            schema_type: schema_type.number(),
            definition: definition.to_owned(),
            encoding: encoding.number(),
            message: message.to_vec(),
            ..Default::default()
        };
        let _: Empty = self.control(Command::ValidateMessage, &request).await?;
        Ok(())
    }

    /// Creates `topic` as `create_topic_with_sources` does, with schema settings: each message
    /// published to it must then match one of the schema's revisions between their bounds.
    /// Refused before the topic is made when the schema or a revision does not exist, or the
    /// caller may not attach the schema (`pubsub.schemas.attach`).
    pub async fn create_topic_with_schema(
        &self,
        topic: Topic,
        replicas: u32,
        sources: u32,
        schema: SchemaSettings,
    ) -> Result<TopicWithSchema> {
        let request = CreateTopicWithSchemaRequest {
            topic: CreateTopicWithSourcesRequest { topic, replicas, sources },
            schema,
        };
        self.control(Command::CreateTopicWithSchema, &request).await
    }

    /// Sets topic `name`'s schema settings (an empty `schema.schema` removes them).
    pub async fn update_topic_schema(&self, name: &str, schema: SchemaSettings) -> Result<TopicWithSchema> {
        let request = UpdateTopicSchemaRequest { name: name.to_owned(), schema };
        self.control(Command::UpdateTopicSchema, &request).await
    }

    /// A topic with its sources and its schema settings (an empty schema: none).
    pub async fn get_topic_with_schema(&self, name: &str) -> Result<TopicWithSchema> {
        self.control(Command::GetTopicWithSchema, &NameRequest { name: name.to_owned() }).await
    }
}
