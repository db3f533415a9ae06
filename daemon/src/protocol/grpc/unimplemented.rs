//! The services Pub/Sub has and Ringpost does not yet: schemas and IAM policies. Each method
//! answers `UNIMPLEMENTED` saying what is missing and what to use instead, so a client that
//! calls one learns why instead of guessing at a missing service.

use ringpost_proto::google::iam::v1 as iam;
use ringpost_proto::pubsub;
use tonic::{Request, Response, Status};

pub struct SchemaService;
pub struct IamPolicyService;

fn no_schemas(method: &str) -> Status {
    Status::unimplemented(format!(
        "google.pubsub.v1.SchemaService.{method}: Ringpost does not implement schemas yet; topics take any message \
         data, and a topic's schema_settings is refused"
    ))
}

fn no_iam(method: &str) -> Status {
    Status::unimplemented(format!(
        "google.iam.v1.IAMPolicy.{method}: Ringpost does not implement IAM policies; who may do what is the \
         daemon's access file (--access-file), with Pub/Sub's roles"
    ))
}

#[tonic::async_trait]
impl pubsub::schema_service_server::SchemaService for SchemaService {
    async fn create_schema(
        &self,
        _: Request<pubsub::CreateSchemaRequest>,
    ) -> Result<Response<pubsub::Schema>, Status> {
        Err(no_schemas("CreateSchema"))
    }

    async fn get_schema(
        &self,
        _: Request<pubsub::GetSchemaRequest>,
    ) -> Result<Response<pubsub::Schema>, Status> {
        Err(no_schemas("GetSchema"))
    }

    async fn list_schemas(
        &self,
        _: Request<pubsub::ListSchemasRequest>,
    ) -> Result<Response<pubsub::ListSchemasResponse>, Status> {
        Err(no_schemas("ListSchemas"))
    }

    async fn list_schema_revisions(
        &self,
        _: Request<pubsub::ListSchemaRevisionsRequest>,
    ) -> Result<Response<pubsub::ListSchemaRevisionsResponse>, Status> {
        Err(no_schemas("ListSchemaRevisions"))
    }

    async fn commit_schema(
        &self,
        _: Request<pubsub::CommitSchemaRequest>,
    ) -> Result<Response<pubsub::Schema>, Status> {
        Err(no_schemas("CommitSchema"))
    }

    async fn rollback_schema(
        &self,
        _: Request<pubsub::RollbackSchemaRequest>,
    ) -> Result<Response<pubsub::Schema>, Status> {
        Err(no_schemas("RollbackSchema"))
    }

    async fn delete_schema_revision(
        &self,
        _: Request<pubsub::DeleteSchemaRevisionRequest>,
    ) -> Result<Response<pubsub::Schema>, Status> {
        Err(no_schemas("DeleteSchemaRevision"))
    }

    async fn delete_schema(&self, _: Request<pubsub::DeleteSchemaRequest>) -> Result<Response<()>, Status> {
        Err(no_schemas("DeleteSchema"))
    }

    async fn validate_schema(
        &self,
        _: Request<pubsub::ValidateSchemaRequest>,
    ) -> Result<Response<pubsub::ValidateSchemaResponse>, Status> {
        Err(no_schemas("ValidateSchema"))
    }

    async fn validate_message(
        &self,
        _: Request<pubsub::ValidateMessageRequest>,
    ) -> Result<Response<pubsub::ValidateMessageResponse>, Status> {
        Err(no_schemas("ValidateMessage"))
    }
}

#[tonic::async_trait]
impl iam::iam_policy_server::IamPolicy for IamPolicyService {
    async fn set_iam_policy(
        &self,
        _: Request<iam::SetIamPolicyRequest>,
    ) -> Result<Response<iam::Policy>, Status> {
        Err(no_iam("SetIAMPolicy"))
    }

    async fn get_iam_policy(
        &self,
        _: Request<iam::GetIamPolicyRequest>,
    ) -> Result<Response<iam::Policy>, Status> {
        Err(no_iam("GetIAMPolicy"))
    }

    async fn test_iam_permissions(
        &self,
        _: Request<iam::TestIamPermissionsRequest>,
    ) -> Result<Response<iam::TestIamPermissionsResponse>, Status> {
        Err(no_iam("TestIAMPermissions"))
    }
}
