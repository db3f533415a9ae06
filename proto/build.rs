//! Compiles the vendored protos (`protos/`) into tonic services and prost messages, and writes
//! their file descriptor set (`descriptors.bin`) for the REST API's routes and JSON.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files =
        ["google/pubsub/v1/pubsub.proto", "google/pubsub/v1/schema.proto", "google/iam/v1/iam_policy.proto"];
    let mut compiler = protox::Compiler::new(["protos"])?;
    compiler.include_source_info(true).include_imports(true).open_files(files)?;
    // Encoded by protox itself rather than through prost-types, which would drop the options'
    // extensions: the `google.api.http` annotations the REST API's routes are read from.
    let encoded = compiler.encode_file_descriptor_set();
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("descriptors.bin"), encoded)?;
    tonic_prost_build::configure()
        // Message data as `Bytes`: decoded as a slice of the request's buffer, not copied.
        .bytes(".google.pubsub.v1.PubsubMessage.data")
        .compile_fds(compiler.file_descriptor_set())?;
    println!("cargo:rerun-if-changed=protos");
    Ok(())
}
