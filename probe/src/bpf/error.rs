//! The errors of loading, attaching and reading the probe's BPF object.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum BpfError {
    #[error("loading BPF programs: {0} (needs root, or CAP_BPF + CAP_PERFMON + CAP_SYS_PTRACE)")]
    Load(libbpf_rs::Error),
    #[error("attaching {what} to {lib} at offset {offset:#x}: {source}")]
    Attach {
        what: &'static str,
        lib: String,
        offset: u64,
        source: libbpf_rs::Error,
    },
    #[error("attaching {what} to {lib} at offset {offset:#x}: {source} (uprobes are attached as uprobe_multi links, which need Linux 6.6 or later)")]
    AttachUprobe {
        what: &'static str,
        lib: String,
        offset: u64,
        source: libbpf_rs::Error,
    },
    #[error("reading BPF map {0}: {1}")]
    Map(&'static str, libbpf_rs::Error),
    #[error("running BPF iterator {0}: {1}")]
    Iter(&'static str, std::io::Error),
}
