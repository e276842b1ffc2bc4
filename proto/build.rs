//! Generates the Rust stubs from `txoutbox/v1/*.proto` with a vendored `protoc`, so a
//! fresh machine builds without installing the protobuf compiler.
//!
//! Two passes: the messages and the clients with tonic-prost's codec, then the servers
//! alone (into `OUT_DIR/server`, on the messages of the first pass) with
//! [`RequestCodec`](src/codec.rs), which makes an undecodable request the caller's fault.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY of intent: build scripts are single-threaded; prost-build reads PROTOC.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let includes = [PathBuf::from("."), protoc_bin_vendored::include_path()?];
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let protos = [
        "txoutbox/v1/message.proto",
        "txoutbox/v1/relay.proto",
        "txoutbox/v1/admin.proto",
    ]
    .map(PathBuf::from);
    tonic_prost_build::configure()
        .build_server(false)
        .file_descriptor_set_path(out_dir.join("txoutbox_descriptor.bin"))
        .compile_protos(&protos, &includes)?;
    let servers = out_dir.join("server");
    std::fs::create_dir_all(&servers)?;
    tonic_prost_build::configure()
        .build_client(false)
        .codec_path("crate::codec::RequestCodec")
        .extern_path(".txoutbox.v1", "crate::v1")
        .out_dir(&servers)
        .compile_protos(&protos, &includes)?;
    for proto in protos {
        println!("cargo:rerun-if-changed={}", proto.display());
    }
    Ok(())
}
