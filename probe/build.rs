//! Builds the BPF programs under ../bpf with Debian's clang through
//! libbpf-cargo and generates their typed skeletons: probe.bpf.c (the
//! pipeline, CPU, waits and I/O), sample.bpf.c (the stack sampler) and
//! procio.bpf.c (a PyTorch job's file reads, per process).

use std::env;
use std::path::{Path, PathBuf};

fn build(bpf_dir: &Path, out_dir: &Path, name: &str) {
    let src = bpf_dir.join(format!("{name}.bpf.c"));
    let out = out_dir.join(format!("{name}.skel.rs"));
    if let Err(e) = libbpf_cargo::SkeletonBuilder::new()
        .source(&src)
        // -Werror: a warning in BPF C is usually a verifier failure later.
        .clang_args(["-I", &bpf_dir.to_string_lossy(), "-Wall", "-Werror"])
        .build_and_generate(&out)
    {
        panic!(
            "building {} failed (is clang installed? run scripts/setup.sh): {e:#}",
            src.display()
        );
    }
}

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let bpf_dir = manifest.join("../bpf");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default());
    build(&bpf_dir, &out_dir, "probe");
    build(&bpf_dir, &out_dir, "sample");
    build(&bpf_dir, &out_dir, "procio");
    for f in [
        "probe.bpf.c",
        "probe_getnext.h",
        "probe_waits.h",
        "probe_io.h",
        "procio.bpf.c",
        "plumber.h",
        "file_syscalls.h",
        "sample.bpf.c",
        "sample.h",
        "stack_copy.h",
        "target.h",
        "python.h",
    ] {
        println!("cargo:rerun-if-changed={}", bpf_dir.join(f).display());
    }
}
