// Compiles proto/ate/v1 with protox (pure Rust), so no protoc is needed anywhere.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let files = [
        "ate/v1/types.proto",
        "ate/v1/exec.proto",
        "ate/v1/api.proto",
        "ate/v1/fleet.proto",
        "ate/v1/node.proto",
        "ate/v1/worker.proto",
    ];
    let fds = protox::compile(files, [&root])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
