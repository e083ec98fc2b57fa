//! Compiles the protocol definitions in `proto/` with a pure-Rust protobuf
//! compiler, so that building needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files =
        ["proto/plugin.proto", "proto/jobcenter.proto", "proto/master.proto", "proto/peer.proto", "proto/worker.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // A worker's messages carry small maps (metadata, parameters,
        // outputs) on every task: ordered maps cost less to fill than
        // SipHash's, and the order they are encoded in is stable.
        .btree_map(".plugin")
        // Messages are moved into and out of the transport whole
        // (src/proto/codec.rs).
        .codec_path("crate::proto::codec::Prost")
        .type_attribute(".jobcenter.v1", "#[derive(serde::Serialize)]")
        .type_attribute(".jobcenter.v1", "#[serde(rename_all = \"snake_case\")]")
        .compile_fds(descriptors)?;
    Ok(())
}
