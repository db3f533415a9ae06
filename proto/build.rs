//! Compiles the vendored protos (`protos/`) into tonic services and prost messages.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files =
        ["google/pubsub/v1/pubsub.proto", "google/pubsub/v1/schema.proto", "google/iam/v1/iam_policy.proto"];
    let descriptors = protox::compile(files, ["protos"])?;
    tonic_prost_build::configure()
        // Message data as `Bytes`: decoded as a slice of the request's buffer, not copied.
        .bytes(".google.pubsub.v1.PubsubMessage.data")
        .compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed=protos");
    Ok(())
}
