//! Google Cloud Pub/Sub's gRPC API as tonic services and prost messages, generated at build
//! time from the protos vendored in `protos/` (see its README for where each comes from).

#![allow(clippy::all, clippy::pedantic)]

pub mod google {
    pub mod pubsub {
        pub mod v1 {
            tonic::include_proto!("google.pubsub.v1");
        }
    }
    pub mod iam {
        pub mod v1 {
            tonic::include_proto!("google.iam.v1");
        }
    }
    pub mod api {
        tonic::include_proto!("google.api");
    }
    pub mod r#type {
        tonic::include_proto!("google.r#type");
    }
}

pub use google::pubsub::v1 as pubsub;

/// The file descriptor set of every proto above and what they import, with their options (the
/// `google.api.http` annotations among them), as `prost_reflect::DescriptorPool::decode` reads it.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));
