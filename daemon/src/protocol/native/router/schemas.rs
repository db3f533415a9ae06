//! The native protocol's schema commands (31 to 39, 44 to 47): decoded into the door's
//! operations, as the router's others, and answered with what the caller asked to see. A
//! schema's change answers the schema as this node then holds it (the door answers once this
//! node applied the change); a topic created with schema settings is refused before it is made
//! when they name no schema the caller may attach, or revisions it lacks, and deleted again
//! when setting them is refused after all.

use super::{name, topic_with_sources_message};
use crate::api::control::{ListRequest, Topic};
use crate::api::{Code, Status};
use crate::auth::Permission;
use crate::catalog::schemas::{SchemaEncoding, SchemaRecord, SchemaRevision, SchemaSettings, SchemaType};
use crate::dispatch::{Caller, Door, MessageCheck, Operation, Outcome};
use crate::net::server::respond;
use crate::storage::Storage;
use ringpost_wire::frame::{access_body, FrameBuffer, FrameHeader};
use ringpost_wire::messages as wire;
use ringpost_wire::Command;

/// How many revisions a ListSchemaRevisions page shows when it asks none (Pub/Sub's default
/// page of lists, as the gRPC API's).
const REVISIONS_PAGE_DEFAULT: usize = 100;

/// Whether `command` is one of the schemas' (this module answers it).
pub(super) fn is_schema_command(command: Command) -> bool {
    use Command::*;
    matches!(
        command,
        CreateSchema
            | GetSchema
            | ListSchemas
            | ListSchemaRevisions
            | CommitSchema
            | RollbackSchema
            | DeleteSchemaRevision
            | DeleteSchema
            | ValidateSchema
            | ValidateMessage
            | CreateTopicWithSchema
            | UpdateTopicSchema
            | GetTopicWithSchema
    )
}

fn schema_type(number: u8) -> Result<SchemaType, Status> {
    SchemaType::from_number(number)
        .ok_or_else(|| Status::invalid_argument("schema_type must be 1 (Protocol Buffer) or 2 (Avro)"))
}

fn encoding(number: u8) -> Result<SchemaEncoding, Status> {
    SchemaEncoding::from_number(number)
        .ok_or_else(|| Status::invalid_argument("encoding must be 1 (JSON) or 2 (binary)"))
}

/// A topic's schema settings as a client sent them: `None` for an empty schema.
fn settings_in(settings: &wire::ArchivedSchemaSettings) -> Result<Option<SchemaSettings>, Status> {
    if settings.schema.is_empty() {
        return Ok(None);
    }
    Ok(Some(SchemaSettings {
        schema: settings.schema.as_str().to_owned(),
        encoding: encoding(settings.encoding)?,
        first_revision_id: settings.first_revision_id.as_str().to_owned(),
        last_revision_id: settings.last_revision_id.as_str().to_owned(),
    }))
}

fn settings_out(settings: Option<SchemaSettings>) -> wire::SchemaSettings {
    let Some(settings) = settings else { return wire::SchemaSettings::default() };
    wire::SchemaSettings {
        schema: settings.schema,
        encoding: settings.encoding as u8,
        first_revision_id: settings.first_revision_id,
        last_revision_id: settings.last_revision_id,
    }
}

/// A revision as the wire shows it; `full` with its definition.
fn schema_out(name: &str, revision: &SchemaRevision, full: bool) -> wire::Schema {
    wire::Schema {
        name: name.to_owned(),
        schema_type: revision.schema_type as u8,
        definition: if full { revision.definition.clone() } else { String::new() },
        revision_id: revision.revision_id.clone(),
        revision_create_time_ms: revision.created_ms,
    }
}

/// The revision `revision_id` of `schema` (empty: its newest).
fn revision_named<'a>(schema: &'a SchemaRecord, revision_id: &str) -> Result<&'a SchemaRevision, Status> {
    if revision_id.is_empty() {
        return Ok(schema.latest());
    }
    schema.revisions.iter().find(|revision| revision.revision_id == revision_id).ok_or_else(|| {
        Status::new(Code::NotFound, format!("revision {revision_id} of schema '{}'", schema.name))
    })
}

/// One page of `schema`'s revisions, newest first, after the revision `page_token` names; the
/// next page's token is the last revision shown when more follow.
fn revisions_page(schema: &SchemaRecord, page_size: u32, page_token: &str, full: bool) -> wire::SchemaList {
    let size = match page_size {
        0 => REVISIONS_PAGE_DEFAULT,
        size => size as usize,
    };
    let newest_first = schema.revisions.iter().rev();
    let after_token: Vec<&SchemaRevision> = match page_token.is_empty() {
        true => newest_first.collect(),
        false => newest_first.skip_while(|revision| revision.revision_id != page_token).skip(1).collect(),
    };
    let shown = &after_token[..after_token.len().min(size)];
    let next_page_token = match after_token.len() > size {
        true => shown.last().map(|revision| revision.revision_id.clone()).unwrap_or_default(),
        false => String::new(),
    };
    wire::SchemaList {
        schemas: shown.iter().map(|revision| schema_out(&schema.name, revision, full)).collect(),
        next_page_token,
    }
}

/// Answers a schema command (`is_schema_command`) for `caller`.
pub(super) async fn dispatch<S: Storage>(
    door: &Door<S>,
    caller: &Caller<'_>,
    header: &FrameHeader,
    command: Command,
    body: &[u8],
) -> Result<FrameBuffer, Status> {
    match command {
        Command::CreateSchema | Command::CommitSchema => {
            let request = access_body::<wire::SchemaRequest>(body)?;
            let (name, schema_type, definition) = (
                request.name.as_str().to_owned(),
                schema_type(request.schema_type)?,
                request.definition.as_str().to_owned(),
            );
            let operation = match command {
                Command::CreateSchema => {
                    Operation::CreateSchema { name: name.clone(), schema_type, definition }
                }
                _ => Operation::CommitSchema { name: name.clone(), schema_type, definition },
            };
            changed(door, caller, header, operation, &name).await
        }
        Command::RollbackSchema | Command::DeleteSchemaRevision => {
            let request = access_body::<wire::SchemaRevisionRequest>(body)?;
            let (name, revision_id) =
                (request.name.as_str().to_owned(), request.revision_id.as_str().to_owned());
            let operation = match command {
                Command::RollbackSchema => Operation::RollbackSchema { name: name.clone(), revision_id },
                _ => Operation::DeleteSchemaRevision { name: name.clone(), revision_id },
            };
            changed(door, caller, header, operation, &name).await
        }
        Command::DeleteSchema => {
            door.execute(caller, Operation::DeleteSchema { name: name(body)? }).await?.into_done()?;
            Ok(respond(header, &wire::Empty {}))
        }
        Command::GetSchema => {
            let request = access_body::<wire::GetSchemaRequest>(body)?;
            let get = Operation::GetSchema { name: request.name.as_str().to_owned() };
            let schema = door.execute(caller, get).await?.into_schema()?;
            let revision = revision_named(&schema, &request.revision_id)?;
            Ok(respond(header, &schema_out(&schema.name, revision, request.full)))
        }
        Command::ListSchemas => {
            let request = access_body::<wire::ListSchemasRequest>(body)?;
            let list = ListRequest {
                topic: String::new(),
                page_size: request.page_size.to_native(),
                page_token: request.page_token.as_str().to_owned(),
            };
            let page = door.execute(caller, Operation::ListSchemas(list)).await?.into_schemas()?;
            let schemas = page
                .items
                .iter()
                .map(|schema| schema_out(&schema.name, schema.latest(), request.full))
                .collect();
            Ok(respond(header, &wire::SchemaList { schemas, next_page_token: page.next_page_token }))
        }
        Command::ListSchemaRevisions => {
            let request = access_body::<wire::ListSchemasRequest>(body)?;
            let list = Operation::ListSchemaRevisions { name: request.name.as_str().to_owned() };
            let schema = door.execute(caller, list).await?.into_schema()?;
            let page =
                revisions_page(&schema, request.page_size.to_native(), &request.page_token, request.full);
            Ok(respond(header, &page))
        }
        Command::ValidateSchema => {
            let request = access_body::<wire::SchemaRequest>(body)?;
            let validate = Operation::ValidateSchema {
                schema_type: schema_type(request.schema_type)?,
                definition: request.definition.as_str().to_owned(),
            };
            door.execute(caller, validate).await?.into_done()?;
            Ok(respond(header, &wire::Empty {}))
        }
        Command::ValidateMessage => {
            let request = access_body::<wire::ValidateMessageRequest>(body)?;
            let given = request.name.is_empty();
            let check = MessageCheck {
                schema: request.name.as_str().to_owned(),
                revision_id: request.revision_id.as_str().to_owned(),
                // A named schema's type is its revision's: the request's is not read.
                schema_type: if given { schema_type(request.schema_type)? } else { SchemaType::Avro },
                definition: request.definition.as_str().to_owned(),
                encoding: encoding(request.encoding)?,
                message: request.message.to_vec(),
            };
            door.execute(caller, Operation::ValidateMessage(Box::new(check))).await?.into_done()?;
            Ok(respond(header, &wire::Empty {}))
        }
        _ => topic_schema(door, caller, header, command, body).await,
    }
}

/// A schema's change, answered with the schema's newest revision as this node holds it once
/// the change applied here (the change's own permission was checked).
async fn changed<S: Storage>(
    door: &Door<S>,
    caller: &Caller<'_>,
    header: &FrameHeader,
    operation: Operation,
    name: &str,
) -> Result<FrameBuffer, Status> {
    door.execute(caller, operation).await?.into_done()?;
    let schema = door.router().schema(name)?;
    Ok(respond(header, &schema_out(&schema.name, schema.latest(), true)))
}

/// The topic commands with schema settings: a creation, a change of its settings, a read.
async fn topic_schema<S: Storage>(
    door: &Door<S>,
    caller: &Caller<'_>,
    header: &FrameHeader,
    command: Command,
    body: &[u8],
) -> Result<FrameBuffer, Status> {
    let topic = match command {
        Command::CreateTopicWithSchema => {
            let request = access_body::<wire::CreateTopicWithSchemaRequest>(body)?;
            let settings = settings_in(&request.schema)?;
            if let Some(settings) = &settings {
                // Refused before the topic is made, so that a refusal creates nothing.
                caller.access.check(caller.session, Permission::SchemasAttach, &settings.schema)?;
                door.router().check_schema_settings(settings)?;
            }
            let create = &request.topic;
            let topic = Topic {
                name: create.topic.name.as_str().to_owned(),
                message_retention_seconds: create.topic.message_retention_seconds.to_native(),
                replicas: create.replicas.to_native(),
                sources: create.sources.to_native(),
                ..Topic::default()
            };
            let topic = door.execute(caller, Operation::CreateTopic(topic)).await?.into_topic()?;
            if settings.is_some() {
                let set = Operation::SetTopicSchema { topic: topic.name.clone(), settings };
                if let Err(refused) = door.execute(caller, set).await.and_then(Outcome::into_done) {
                    // A refusal creates nothing: the topic goes again (its schema was deleted or
                    // changed since the check above), as the gRPC API's CreateTopic does.
                    let _ = door.execute(caller, Operation::DeleteTopic { name: topic.name.clone() }).await;
                    return Err(refused);
                }
            }
            topic
        }
        Command::UpdateTopicSchema => {
            let request = access_body::<wire::UpdateTopicSchemaRequest>(body)?;
            let name = request.name.as_str().to_owned();
            let settings = settings_in(&request.schema)?;
            door.execute(caller, Operation::SetTopicSchema { topic: name.clone(), settings })
                .await?
                .into_done()?;
            door.router().get_topic(&name)?
        }
        Command::GetTopicWithSchema => {
            door.execute(caller, Operation::GetTopic { name: name(body)? }).await?.into_topic()?
        }
        other => return Err(Status::internal(format!("{other:?} is not a schema command"))),
    };
    let settings = door.router().topics_schema_settings(std::slice::from_ref(&topic.name)).pop().flatten();
    let answer =
        wire::TopicWithSchema { topic: topic_with_sources_message(topic), schema: settings_out(settings) };
    Ok(respond(header, &answer))
}
