//! The service Pub/Sub has and Ringpost does not: IAM policies. Each method
//! answers `UNIMPLEMENTED` saying what is missing and what to use instead, so a client that
//! calls one learns why instead of guessing at a missing service.

use ringpost_proto::google::iam::v1 as iam;
use tonic::{Request, Response, Status};

pub struct IamPolicyService;

fn no_iam(method: &str) -> Status {
    Status::unimplemented(format!(
        "google.iam.v1.IAMPolicy.{method}: Ringpost does not implement IAM policies; who may do what is the \
         daemon's access file (--access-file), with Pub/Sub's roles"
    ))
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
