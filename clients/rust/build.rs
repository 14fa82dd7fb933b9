// Generates the sidecar's messages and client stub from the repository's proto at build time.
// protoc comes from the protoc-bin-vendored crate, so a user needs no system protoc.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest.join("../../proto");
    let proto = proto_root.join("contextsidecar/v1/sidecar.proto");
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let well_known = protoc_bin_vendored::include_path()?;
    // SAFETY: the build script is single-threaded; tonic-prost-build reads PROTOC to find protoc.
    unsafe { std::env::set_var("PROTOC", protoc) };
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&[proto], &[proto_root, well_known])?;
    Ok(())
}
