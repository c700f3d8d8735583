//! Builds the BPF programs under ../bpf with Debian's clang through
//! libbpf-cargo and generates the typed skeleton.

use std::env;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let bpf_dir = manifest.join("../bpf");
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default()).join("probe.skel.rs");
    let src = bpf_dir.join("probe.bpf.c");
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
    for f in ["probe.bpf.c", "plumber.h"] {
        println!("cargo:rerun-if-changed={}", bpf_dir.join(f).display());
    }
}
