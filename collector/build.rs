//! Compiles the PipelineSnapshot schema (stats.pb) and pprof's profile.proto
//! (profile.pb.gz) with protox (pure Rust), so no system `protoc` is needed
//! on a fresh machine.

fn main() {
    let files = [
        "proto/tensorflow/core/framework/graph.proto",
        "proto/tensorflow/core/framework/input_pipeline_analysis.proto",
        "proto/pprof/profile.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = match protox::compile(files, ["proto"]) {
        Ok(fds) => fds,
        Err(e) => panic!("compiling the stats.pb and profile.proto schemas failed: {e}"),
    };
    // Maps as BTreeMap: a NodeDef's attrs are then encoded in key order, so
    // the same recording always gives the same stats.pb bytes.
    if let Err(e) = prost_build::Config::new().btree_map(["."]).compile_fds(fds) {
        panic!("generating Rust code for the stats.pb and profile.proto schemas failed: {e}");
    }
}
