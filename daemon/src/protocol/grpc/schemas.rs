//! `google.pubsub.v1.SchemaService`: schemas and their revisions, kept in the catalog by the
//! router (`router::schemas`), and checks of a schema or a message that need no catalog.
//!
//! Every method runs through the door (`dispatch`), which decides who may with Pub/Sub's
//! `pubsub.schemas.*` (`Kind::permission`), as for the native protocol. A change is carried to
//! the catalog's leader from any node and answered once this node applied it; the schema it
//! made is then read here.

use super::convert;
use super::credentials::Presented;
use super::gateway::Gateway;
use super::names::{self, Kind};
use crate::api::control::ListRequest;
use crate::api::Status as DomainStatus;
use crate::auth::Permission;
use crate::catalog::schemas::{
    SchemaEncoding, SchemaRecord, SchemaRevision, SchemaSettings as CatalogSchemaSettings, SchemaType,
};
use crate::dispatch::{MessageCheck, Operation, Outcome};
use crate::router::{ControlError, Router};
use crate::storage::dma::DmaStorage;
use ringpost_proto::pubsub;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// How many revisions a ListSchemaRevisions page shows when it asks none (Pub/Sub's default
/// page of lists).
const REVISIONS_PAGE_DEFAULT: usize = 100;

pub struct SchemaService {
    pub gateway: Arc<Gateway>,
}

/// Runs `work` on the router shard for whom `presented` authenticates, once it holds
/// `permission` on `name`.
async fn on_router<R, F, Fut>(
    gateway: &Gateway,
    presented: &Presented,
    permission: Permission,
    name: &str,
    work: F,
) -> Result<R, Status>
where
    R: Send + 'static,
    F: FnOnce(Rc<Router<DmaStorage>>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<R, ControlError>> + 'static,
{
    let (presented, name) = (presented.clone(), name.to_owned());
    let answer = gateway
        .router
        .try_call(move |shard| async move {
            let session = presented.session(&shard.access)?;
            shard.access.check(&session, permission, &name)?;
            work(shard.router.clone()).await.map_err(DomainStatus::from)
        })
        .await;
    Ok(answer?)
}

/// Runs an operation that answers nothing through the door (who may; a change at the
/// catalog's leader).
async fn execute(gateway: &Gateway, presented: &Presented, operation: Operation) -> Result<(), Status> {
    Ok(gateway.execute(presented, operation).await.and_then(Outcome::into_done)?)
}

/// Schema `name` as this node's catalog holds it, once a change the caller made was applied
/// here (the door answers only then): its permission was checked with the change.
async fn read_schema(gateway: &Gateway, name: &str) -> Result<SchemaRecord, Status> {
    let name = name.to_owned();
    Ok(gateway.router.try_call(move |shard| async move { Ok(shard.router.schema(&name)?) }).await?)
}

/// A schema's name and, after `@`, the revision it names (Pub/Sub's `name@revision_id`).
fn schema_name(field: &str, text: &str) -> Result<(names::Name, Option<String>), Status> {
    let (name, revision) = match text.split_once('@') {
        Some((name, revision)) => (name, Some(revision.to_owned())),
        None => (text, None),
    };
    Ok((names::parse(field, Kind::Schema, name)?, revision))
}

/// A schema's type as Pub/Sub numbers it.
fn schema_type_in(number: i32) -> Result<SchemaType, Status> {
    u8::try_from(number)
        .ok()
        .and_then(SchemaType::from_number)
        .ok_or_else(|| Status::invalid_argument("schema.type must be PROTOCOL_BUFFER or AVRO"))
}

/// A message encoding as Pub/Sub numbers it.
pub fn encoding_in(field: &str, number: i32) -> Result<SchemaEncoding, Status> {
    crate::router::schemas::schema_encoding(number)
        .ok_or_else(|| Status::invalid_argument(format!("{field} must be JSON or BINARY")))
}

/// A revision of a schema as Pub/Sub shows it: BASIC leaves the definition out.
fn schema_out(project: &str, name: &str, revision: &SchemaRevision, full: bool) -> pubsub::Schema {
    pubsub::Schema {
        name: names::format(project, Kind::Schema, name),
        r#type: revision.schema_type as i32,
        definition: if full { revision.definition.clone() } else { String::new() },
        revision_id: revision.revision_id.clone(),
        revision_create_time: Some(convert::timestamp(revision.created_ms)),
    }
}

/// Whether `view` asks the definition; `default_full` when it is unspecified.
fn full_view(view: i32, default_full: bool) -> bool {
    match pubsub::SchemaView::try_from(view) {
        Ok(pubsub::SchemaView::Basic) => false,
        Ok(pubsub::SchemaView::Full) => true,
        _ => default_full,
    }
}

/// The revision of `schema` a name names, or its newest.
fn revision_named<'a>(
    schema: &'a SchemaRecord,
    revision: Option<&str>,
) -> Result<&'a SchemaRevision, Status> {
    match revision {
        None => Ok(schema.latest()),
        Some(revision_id) => {
            schema.revisions.iter().find(|revision| revision.revision_id == revision_id).ok_or_else(|| {
                Status::not_found(format!("Resource not found (resource={}@{revision_id}).", schema.name))
            })
        }
    }
}

/// A schema given in a request: its type and definition, checked.
fn schema_in(schema: Option<&pubsub::Schema>) -> Result<(SchemaType, String), Status> {
    let schema = schema.ok_or_else(|| Status::invalid_argument("schema is required"))?;
    Ok((schema_type_in(schema.r#type)?, schema.definition.clone()))
}

#[tonic::async_trait]
impl pubsub::schema_service_server::SchemaService for SchemaService {
    async fn create_schema(
        &self,
        request: Request<pubsub::CreateSchemaRequest>,
    ) -> Result<Response<pubsub::Schema>, Status> {
        let presented = Presented::of(&request);
        let request = request.into_inner();
        let project = names::parse_project("parent", &request.parent)?;
        let id = match request.schema_id.is_empty() {
            false => request.schema_id.clone(),
            // The schema's own name, when the request names it there.
            true => request
                .schema
                .as_ref()
                .map(|schema| schema.name.rsplit('/').next().unwrap_or("").to_owned())
                .unwrap_or_default(),
        };
        let name = names::parse("schema_id", Kind::Schema, &names::format(&project, Kind::Schema, &id))?.name;
        let (schema_type, definition) = schema_in(request.schema.as_ref())?;
        let create = Operation::CreateSchema { name: name.clone(), schema_type, definition };
        execute(&self.gateway, &presented, create).await.map_err(|status| match status.code() {
            tonic::Code::AlreadyExists => {
                Status::already_exists(format!("Resource already exists in the project (resource={id})."))
            }
            _ => status,
        })?;
        let created = read_schema(&self.gateway, &name).await?;
        Ok(Response::new(schema_out(&project, &created.name, created.latest(), true)))
    }

    async fn get_schema(
        &self,
        request: Request<pubsub::GetSchemaRequest>,
    ) -> Result<Response<pubsub::Schema>, Status> {
        let presented = Presented::of(&request);
        let (name, revision) = schema_name("name", &request.get_ref().name)?;
        let full = full_view(request.get_ref().view, true);
        let get = Operation::GetSchema { name: name.name.clone() };
        let schema = schema_for_reader(&self.gateway, &presented, get).await?;
        let revision = revision_named(&schema, revision.as_deref())?;
        Ok(Response::new(schema_out(&name.project, &schema.name, revision, full)))
    }

    async fn list_schemas(
        &self,
        request: Request<pubsub::ListSchemasRequest>,
    ) -> Result<Response<pubsub::ListSchemasResponse>, Status> {
        let presented = Presented::of(&request);
        let request = request.into_inner();
        let project = names::parse_project("parent", &request.parent)?;
        let page_size = convert::unsigned("page_size", request.page_size)?;
        let list = ListRequest { topic: String::new(), page_size, page_token: request.page_token };
        let page = self.gateway.execute(&presented, Operation::ListSchemas(list)).await?.into_schemas()?;
        let full = full_view(request.view, false);
        Ok(Response::new(pubsub::ListSchemasResponse {
            schemas: page
                .items
                .iter()
                .map(|schema| schema_out(&project, &schema.name, schema.latest(), full))
                .collect(),
            next_page_token: page.next_page_token,
        }))
    }

    async fn list_schema_revisions(
        &self,
        request: Request<pubsub::ListSchemaRevisionsRequest>,
    ) -> Result<Response<pubsub::ListSchemaRevisionsResponse>, Status> {
        let presented = Presented::of(&request);
        let request = request.into_inner();
        let name = names::parse("name", Kind::Schema, &request.name)?;
        let list = Operation::ListSchemaRevisions { name: name.name.clone() };
        let schema = schema_for_reader(&self.gateway, &presented, list).await?;
        let size = match convert::unsigned("page_size", request.page_size)? {
            0 => REVISIONS_PAGE_DEFAULT,
            size => size as usize,
        };
        // Newest first, as Pub/Sub lists them; a page's token is the last revision it showed.
        let newest_first = schema.revisions.iter().rev();
        let after_token: Vec<&SchemaRevision> = match request.page_token.is_empty() {
            true => newest_first.collect(),
            false => newest_first
                .skip_while(|revision| revision.revision_id != request.page_token)
                .skip(1)
                .collect(),
        };
        let full = full_view(request.view, false);
        let shown = &after_token[..after_token.len().min(size)];
        let next_page_token = match after_token.len() > size {
            true => shown.last().map(|revision| revision.revision_id.clone()).unwrap_or_default(),
            false => String::new(),
        };
        Ok(Response::new(pubsub::ListSchemaRevisionsResponse {
            schemas: shown
                .iter()
                .map(|revision| schema_out(&name.project, &schema.name, revision, full))
                .collect(),
            next_page_token,
        }))
    }

    async fn commit_schema(
        &self,
        request: Request<pubsub::CommitSchemaRequest>,
    ) -> Result<Response<pubsub::Schema>, Status> {
        let presented = Presented::of(&request);
        let request = request.into_inner();
        let name = names::parse("name", Kind::Schema, &request.name)?;
        let (schema_type, definition) = schema_in(request.schema.as_ref())?;
        let commit = Operation::CommitSchema { name: name.name.clone(), schema_type, definition };
        execute(&self.gateway, &presented, commit)
            .await
            .map_err(|status| not_found_wording(status, &name.name))?;
        let schema = read_schema(&self.gateway, &name.name).await?;
        Ok(Response::new(schema_out(&name.project, &schema.name, schema.latest(), true)))
    }

    async fn rollback_schema(
        &self,
        request: Request<pubsub::RollbackSchemaRequest>,
    ) -> Result<Response<pubsub::Schema>, Status> {
        let presented = Presented::of(&request);
        let request = request.into_inner();
        let name = names::parse("name", Kind::Schema, &request.name)?;
        if request.revision_id.is_empty() {
            return Err(Status::invalid_argument("revision_id is required"));
        }
        let rollback =
            Operation::RollbackSchema { name: name.name.clone(), revision_id: request.revision_id };
        execute(&self.gateway, &presented, rollback).await?;
        let schema = read_schema(&self.gateway, &name.name).await?;
        Ok(Response::new(schema_out(&name.project, &schema.name, schema.latest(), true)))
    }

    async fn delete_schema_revision(
        &self,
        request: Request<pubsub::DeleteSchemaRevisionRequest>,
    ) -> Result<Response<pubsub::Schema>, Status> {
        let presented = Presented::of(&request);
        let request = request.into_inner();
        #[allow(deprecated)]
        let given = request.revision_id;
        let (name, named) = schema_name("name", &request.name)?;
        let revision_id = named.or((!given.is_empty()).then_some(given)).ok_or_else(|| {
            Status::invalid_argument("the revision to delete is required: name@revision_id")
        })?;
        let delete = Operation::DeleteSchemaRevision { name: name.name.clone(), revision_id };
        execute(&self.gateway, &presented, delete).await?;
        let schema = read_schema(&self.gateway, &name.name).await?;
        Ok(Response::new(schema_out(&name.project, &schema.name, schema.latest(), true)))
    }

    async fn delete_schema(
        &self,
        request: Request<pubsub::DeleteSchemaRequest>,
    ) -> Result<Response<()>, Status> {
        let presented = Presented::of(&request);
        let name = names::parse("name", Kind::Schema, &request.get_ref().name)?;
        let delete = Operation::DeleteSchema { name: name.name.clone() };
        execute(&self.gateway, &presented, delete)
            .await
            .map_err(|status| not_found_wording(status, &name.name))?;
        // Topics' cached schemas go with it at once on this node (`Gateway::topic_schema`).
        self.gateway.forget_schemas();
        Ok(Response::new(()))
    }

    async fn validate_schema(
        &self,
        request: Request<pubsub::ValidateSchemaRequest>,
    ) -> Result<Response<pubsub::ValidateSchemaResponse>, Status> {
        let presented = Presented::of(&request);
        names::parse_project("parent", &request.get_ref().parent)?;
        let (schema_type, definition) = schema_in(request.get_ref().schema.as_ref())?;
        execute(&self.gateway, &presented, Operation::ValidateSchema { schema_type, definition }).await?;
        Ok(Response::new(pubsub::ValidateSchemaResponse {}))
    }

    async fn validate_message(
        &self,
        request: Request<pubsub::ValidateMessageRequest>,
    ) -> Result<Response<pubsub::ValidateMessageResponse>, Status> {
        use pubsub::validate_message_request::SchemaSpec;
        let presented = Presented::of(&request);
        let request = request.into_inner();
        names::parse_project("parent", &request.parent)?;
        let encoding = encoding_in("encoding", request.encoding)?;
        let mut check = MessageCheck {
            schema: String::new(),
            revision_id: String::new(),
            schema_type: SchemaType::Avro,
            definition: String::new(),
            encoding,
            message: request.message.to_vec(),
        };
        match request.schema_spec {
            Some(SchemaSpec::Schema(schema)) => {
                (check.schema_type, check.definition) = schema_in(Some(&schema))?;
            }
            Some(SchemaSpec::Name(text)) => {
                let (name, revision) = schema_name("name", &text)?;
                (check.schema, check.revision_id) = (name.name, revision.unwrap_or_default());
            }
            None => return Err(Status::invalid_argument("name or schema is required")),
        };
        let name = check.schema.clone();
        execute(&self.gateway, &presented, Operation::ValidateMessage(Box::new(check)))
            .await
            .map_err(|status| not_found_wording(status, &name))?;
        Ok(Response::new(pubsub::ValidateMessageResponse {}))
    }
}

/// The schema a read (`GetSchema`, `ListSchemaRevisions`) names, through the door (who may),
/// with Pub/Sub's wording when there is none.
async fn schema_for_reader(
    gateway: &Gateway,
    presented: &Presented,
    read: Operation,
) -> Result<SchemaRecord, Status> {
    let name = read.resource().to_owned();
    let outcome = gateway.execute(presented, read).await.and_then(Outcome::into_schema);
    outcome.map_err(|status| not_found_wording(status.into(), &name))
}

/// Pub/Sub's wording for a schema not found.
fn not_found_wording(status: Status, name: &str) -> Status {
    match status.code() {
        tonic::Code::NotFound => Status::not_found(format!("Resource not found (resource={name}).")),
        _ => status,
    }
}

// --- Topics' schema settings, for the Publisher's handlers ----------------------------------

/// Refuses `settings` unless they name a schema and revisions it has, and the caller may
/// attach it (before a topic is created with them, so that a refusal creates nothing).
pub(super) async fn check_topic_schema(
    gateway: &Gateway,
    presented: &Presented,
    settings: &CatalogSchemaSettings,
) -> Result<(), Status> {
    let settings = settings.clone();
    let name = settings.schema.clone();
    on_router(gateway, presented, Permission::SchemasAttach, &name, move |router| async move {
        router.check_schema_settings(&settings)
    })
    .await
}

/// Sets topic `topic`'s schema settings (`None`: clears them), for who may update it, or
/// create it (`Kind::SetTopicSchema`).
pub(super) async fn set_topic_schema(
    gateway: &Gateway,
    presented: &Presented,
    topic: &str,
    settings: Option<CatalogSchemaSettings>,
) -> Result<(), Status> {
    let answer =
        execute(gateway, presented, Operation::SetTopicSchema { topic: topic.to_owned(), settings }).await;
    gateway.forget_schemas();
    answer
}

/// Shows each of `topics`' schema settings (named in `project`), where it has any.
pub(super) async fn show_topic_schemas(
    gateway: &Gateway,
    project: &str,
    topics: &mut [pubsub::Topic],
) -> Result<(), Status> {
    let names: Vec<String> =
        topics.iter().map(|topic| topic.name.rsplit('/').next().unwrap_or_default().to_owned()).collect();
    let settings = gateway
        .router
        .try_call(move |shard| async move { Ok(shard.router.topics_schema_settings(&names)) })
        .await?;
    for (topic, settings) in topics.iter_mut().zip(settings) {
        topic.schema_settings = settings.map(|settings| convert::schema_settings_out(project, &settings));
    }
    Ok(())
}
