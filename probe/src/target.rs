//! The target process: does it exist, may we look at it, where are its
//! TensorFlow libraries (as files we can open, through `/proc/PID/root`, so
//! a target in a container resolves its own libraries), and where are they
//! mapped.

use std::fs;
use std::path::{Path, PathBuf};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum TargetError {
    #[error("no process with PID {0} (check the PID; inside a container use the PID as the host sees it)")]
    NoSuchProcess(i32),
    #[error("cannot read /proc/{pid}/{what}: {source} ({hint})")]
    Permission {
        pid: i32,
        what: &'static str,
        source: std::io::Error,
        hint: &'static str,
    },
    #[error("reading /proc/{pid}/{what}: {source}")]
    Io {
        pid: i32,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("process {pid} ({comm}) has no TensorFlow loaded (no {lib} in its memory map)")]
    NoTensorFlow {
        pid: i32,
        comm: String,
        lib: &'static str,
    },
    /// Neither framework: what `framework::find` says for a process
    /// without TensorFlow whose map has no PyTorch either.
    #[error("process {pid} ({comm}) has no TensorFlow loaded (no {lib} in its memory map), nor PyTorch (no libtorch_python.so); attach to the Python process that runs the tf.data pipeline or iterates the DataLoader")]
    NoFramework {
        pid: i32,
        comm: String,
        lib: &'static str,
    },
}

/// One mapped shared library of the target.
#[derive(Debug, Clone)]
pub struct Library {
    /// Path as the target sees it (inside its mount namespace).
    pub path: String,
    /// Path we can open (through /proc/PID/root).
    pub host_path: PathBuf,
}

#[derive(Debug, Clone)]
pub struct Target {
    pub pid: i32,
    pub framework: Library,
    pub cc: Option<Library>,
    /// Where CPython's GIL functions may live: libpython if mapped, and the
    /// executable (a statically linked python exports them itself).
    pub python: Vec<Library>,
    /// The C library whose file functions the target calls (glibc's
    /// `libc.so.6`); None for a static or unusual libc.
    pub libc: Option<Library>,
    pub tensorflow_version: String,
}

pub const FRAMEWORK_LIB: &str = "libtensorflow_framework.so.2";
pub const CC_LIB: &str = "libtensorflow_cc.so.2";

/// What to do about a refused /proc read. Root can be refused too (a
/// Firecracker VM's init, a process of another user namespace, a security
/// module's policy), and "run as root" would then send the user in a
/// circle.
fn permission_hint(root: bool) -> &'static str {
    if root {
        "refused even to root: another user namespace or a security module such as SELinux or AppArmor protects the process; attach from where its owner could, or start the job under the shim: plumber-probe run -- CMD"
    } else {
        "run as root: sudo plumber-probe ..., or grant CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE"
    }
}

fn io_err(pid: i32, what: &'static str, e: std::io::Error) -> TargetError {
    match e.kind() {
        std::io::ErrorKind::NotFound => TargetError::NoSuchProcess(pid),
        std::io::ErrorKind::PermissionDenied => TargetError::Permission {
            pid,
            what,
            source: e,
            hint: permission_hint(nix::unistd::geteuid().is_root()),
        },
        _ => TargetError::Io {
            pid,
            what,
            source: e,
        },
    }
}

/// True if the process still exists (and is not a zombie).
pub fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => stat_state(&s).is_some_and(|c| c != 'Z' && c != 'X'),
        Err(_) => false,
    }
}

fn stat_state(stat: &str) -> Option<char> {
    // comm may contain spaces and parentheses: the state follows the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.trim_start().chars().next()
}

/// utime + stime of the whole process, in ns.
pub fn process_cpu_ns(pid: i32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields after comm start at "state" (field 3); utime is field 14.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) * 1_000_000_000 / clk_tck())
}

/// The CPU of `root` and of every live process below it, ns: each one's
/// utime + stime and the cutime + cstime of the children it reaped, plus
/// the same of `also` (processes of the job found otherwise) not below it.
/// A process that ends moves from its own sum to its reaper's, so the
/// total only grows when the reaper is in the tree, whichever it is: a
/// forkserver reaps the DataLoader workers it forked each epoch, and the
/// training process, its parent, sees none of their CPU until the
/// forkserver itself ends. None when `root` cannot be read.
pub fn job_tree_cpu_ns(root: i32, also: &[i32]) -> Option<u64> {
    tree_cpu_ns(root, also, true)
}

/// The CPU of `root` and of `others`, the rest of its job known otherwise
/// (the processes the BPF side follows from their fork), ns, as
/// `job_tree_cpu_ns` counts it, without the walk of /proc for the
/// processes below `root`: a read of every thread's children file, each
/// poll (half of the probe's /proc reads on a DataLoader job).
pub fn job_cpu_ns(root: i32, others: &[i32]) -> Option<u64> {
    tree_cpu_ns(root, others, false)
}

fn tree_cpu_ns(root: i32, also: &[i32], walk: bool) -> Option<u64> {
    let mut seen = std::collections::HashSet::new();
    let mut queue = vec![root];
    queue.extend_from_slice(also);
    let mut total = 0;
    let mut i = 0;
    while i < queue.len() {
        let pid = queue[i];
        i += 1;
        if !seen.insert(pid) {
            continue;
        }
        match process_tree_cpu_ns(pid) {
            Some(ns) => total += ns,
            None if pid == root => return None,
            None => continue,
        }
        if walk {
            queue.extend(children(pid));
        }
    }
    Some(total)
}

/// The processes each thread of `pid` started and that still run (or wait
/// to be reaped), from /proc/PID/task/TID/children: a child's parent is
/// the thread that forked it.
fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// utime + stime of the process and of its children that it waited for
/// (cutime + cstime), in ns: a job whose worker processes come and go keeps
/// their CPU this way once they are reaped.
pub fn process_tree_cpu_ns(pid: i32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = (11..=14)
        .map(|i| f.get(i).and_then(|v| v.parse::<u64>().ok()))
        .sum::<Option<u64>>()?;
    Some(ticks * 1_000_000_000 / clk_tck())
}

/// Busy CPU time of the whole machine since boot, ns: /proc/stat's first
/// line, every state but idle and iowait (steal counts: the host ran
/// something else on our CPUs).
pub fn machine_busy_ns() -> Option<u64> {
    let s = fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest is inside user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some(total.saturating_sub(idle) * 1_000_000_000 / clk_tck())
}

fn clk_tck() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as u64
    } else {
        100
    }
}

/// The tightest cgroup v2 CPU quota (cpu.max) on the process's cgroup path,
/// in cores; None when none is set or cgroup v2 is not mounted.
pub fn cpu_quota_cores(pid: i32) -> Option<f64> {
    let cg = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = cg.lines().find_map(|l| l.strip_prefix("0::"))?.trim();
    let mut dir = Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'));
    let mut best: Option<f64> = None;
    loop {
        if let Ok(max) = fs::read_to_string(dir.join("cpu.max")) {
            let mut it = max.split_whitespace();
            let quota = it.next().and_then(|q| q.parse::<f64>().ok());
            let period = it.next().and_then(|p| p.parse::<f64>().ok());
            if let (Some(q), Some(p)) = (quota, period) {
                if q > 0.0 && p > 0.0 {
                    let c = q / p;
                    best = Some(best.map_or(c, |b: f64| b.min(c)));
                }
            }
        }
        if dir == Path::new("/sys/fs/cgroup") || !dir.pop() {
            break;
        }
    }
    best
}

impl Target {
    pub fn open(pid: i32) -> Result<Target, TargetError> {
        if pid <= 0 || !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(TargetError::NoSuchProcess(pid));
        }
        let comm = fs::read_to_string(format!("/proc/{pid}/comm"))
            .map_err(|e| io_err(pid, "comm", e))?
            .trim()
            .to_string();
        let maps =
            fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| io_err(pid, "maps", e))?;
        // Reading maps works for any user on their own processes; opening
        // files through /proc/PID/root needs ptrace access, so check it now
        // to give the permission hint before doing any work.
        fs::read_link(format!("/proc/{pid}/root")).map_err(|e| io_err(pid, "root", e))?;
        let framework =
            find_library(pid, &maps, FRAMEWORK_LIB).ok_or(TargetError::NoTensorFlow {
                pid,
                comm: comm.clone(),
                lib: FRAMEWORK_LIB,
            })?;
        let cc = find_library(pid, &maps, CC_LIB);
        let tensorflow_version = tensorflow_version(&framework.host_path).unwrap_or_default();
        let mut python: Vec<Library> = mapped_files(&maps)
            .filter(|p| {
                p.rsplit('/')
                    .next()
                    .is_some_and(|f| f.starts_with("libpython3") && f.contains(".so"))
            })
            .map(|p| library(pid, p))
            .take(1)
            .collect();
        if let Ok(exe) = fs::read_link(format!("/proc/{pid}/exe")) {
            python.push(library(pid, &exe.to_string_lossy()));
        }
        let libc = find_library(pid, &maps, "libc.so.6");
        Ok(Target {
            pid,
            framework,
            cc,
            python,
            libc,
            tensorflow_version,
        })
    }

    /// A Python process that runs no TensorFlow but another framework,
    /// whose library `lib` (as the target names it) stands in for
    /// TensorFlow's.
    pub fn other_framework(pid: i32, lib: &str) -> Result<Target, TargetError> {
        if pid <= 0 || !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(TargetError::NoSuchProcess(pid));
        }
        let maps =
            fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| io_err(pid, "maps", e))?;
        fs::read_link(format!("/proc/{pid}/root")).map_err(|e| io_err(pid, "root", e))?;
        Ok(Target {
            pid,
            framework: library(pid, lib),
            cc: None,
            python: Vec::new(),
            libc: find_library(pid, &maps, "libc.so.6"),
            tensorflow_version: String::new(),
        })
    }

    /// The target as a recording describes it; `mode`: how the pipeline
    /// is read.
    pub fn info(&self, mode: &str) -> plumber_collector::event::TargetInfo {
        let mem = fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let kb = |key: &str| {
            mem.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or(0)
                * 1024
        };
        plumber_collector::event::TargetInfo {
            pid: self.pid as i64,
            tensorflow_version: self.tensorflow_version.clone(),
            libraries: self.libraries(),
            mode: mode.to_string(),
            num_cores: std::thread::available_parallelism()
                .map(|n| n.get() as i64)
                .unwrap_or(1),
            cpu_quota_cores: cpu_quota_cores(self.pid),
            memory_total: kb("MemTotal:"),
            memory_free: kb("MemAvailable:"),
            not_measured: Vec::new(),
        }
    }

    pub fn libraries(&self) -> Vec<String> {
        let mut v = vec![self.framework.path.clone()];
        if let Some(cc) = &self.cc {
            v.push(cc.path.clone());
        }
        v
    }
}

fn library(pid: i32, path: &str) -> Library {
    Library {
        path: path.to_string(),
        host_path: PathBuf::from(format!("/proc/{pid}/root{path}")),
    }
}

/// Paths of the files mapped at offset 0 (each object once).
fn mapped_files(maps: &str) -> impl Iterator<Item = &str> {
    maps.lines().filter_map(|line| {
        let mut it = line.splitn(6, char::is_whitespace);
        let _range = it.next()?;
        let _perms = it.next()?;
        let offset = it.next()?;
        let _dev = it.next()?;
        let _inode = it.next()?;
        let path = it.next()?.trim_start();
        (offset.chars().all(|c| c == '0') && path.starts_with('/')).then_some(path)
    })
}

fn find_library(pid: i32, maps: &str, name: &str) -> Option<Library> {
    for line in maps.lines() {
        let mut it = line.split_whitespace();
        let _range = it.next()?;
        let _perms = it.next()?;
        let offset = u64::from_str_radix(it.next()?, 16).ok()?;
        let _dev = it.next();
        let _inode = it.next();
        let path: String = it.collect::<Vec<_>>().join(" ");
        let file = path.rsplit('/').next().unwrap_or("");
        if file != name || offset != 0 {
            continue;
        }
        let host_path = PathBuf::from(format!("/proc/{pid}/root{path}"));
        return Some(Library { path, host_path });
    }
    None
}

/// TensorFlow's version from the wheel's dist-info beside the package
/// (`site-packages/tensorflow_cpu-2.21.0.dist-info`), since the version
/// string inside the library is not exported in a stable place.
fn tensorflow_version(framework: &Path) -> Option<String> {
    let site = framework.parent()?.parent()?;
    let mut found = None;
    for entry in fs::read_dir(site).ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        for prefix in [
            "tensorflow_cpu-",
            "tensorflow-",
            "tensorflow_gpu-",
            "tf_nightly-",
        ] {
            if let Some(rest) = name.strip_prefix(prefix) {
                if let Some(ver) = rest.strip_suffix(".dist-info") {
                    found = Some(ver.to_string());
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_keeps_the_cpu_of_a_grandchild_its_child_reaped() {
        // sh forks a subshell that spins, reaps it and sleeps on, as a
        // forkserver does with the workers it forks: the subshell's CPU
        // is in sh's children times, which ours do not hold.
        let mut sh = std::process::Command::new("sh")
            .args([
                "-c",
                "(i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done); exec sleep 30",
            ])
            .spawn()
            .expect("sh");
        let pid = sh.id() as i32;
        let me = std::process::id() as i32;
        let mut reaped = 0;
        for _ in 0..400 {
            reaped = process_tree_cpu_ns(pid)
                .unwrap_or(0)
                .saturating_sub(process_cpu_ns(pid).unwrap_or(u64::MAX));
            if reaped > 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let ours = process_tree_cpu_ns(me).expect("our own times");
        let job = job_tree_cpu_ns(me, &[]).expect("the tree's");
        let known = job_cpu_ns(me, &[pid]).expect("the job's");
        let _ = sh.kill();
        let _ = sh.wait();
        assert!(reaped > 0, "the subshell was not reaped within 20 s");
        assert!(
            job >= ours + reaped,
            "the tree's {job} ns leave out the {reaped} ns sh reaped (ours {ours} ns)"
        );
        assert!(known >= ours + reaped, "{known} ns with sh named");
        assert_eq!(job_tree_cpu_ns(-1, &[me]), None);
        assert_eq!(job_cpu_ns(-1, &[me]), None);
    }

    #[test]
    fn root_refused_is_not_told_to_run_as_root() {
        let refused = |root| TargetError::Permission {
            pid: 1,
            what: "maps",
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            hint: permission_hint(root),
        };
        let as_root = refused(true).to_string();
        assert!(!as_root.contains("sudo"), "{as_root}");
        assert!(as_root.contains("plumber-probe run -- CMD"), "{as_root}");
        assert!(refused(false).to_string().contains("sudo plumber-probe"));
    }

    #[test]
    fn stat_state_handles_odd_comm() {
        assert_eq!(stat_state("12 (a) b) S 1 2"), Some('S'));
        assert_eq!(stat_state("12 (x) Z 1"), Some('Z'));
    }

    #[test]
    fn finds_library_at_offset_zero() {
        let maps = "7f0000000000-7f0000001000 r--p 00000000 08:01 12 /x/libtensorflow_framework.so.2\n\
                    7f0000001000-7f0000002000 r-xp 00001000 08:01 12 /x/libtensorflow_framework.so.2\n";
        let lib = find_library(1, maps, FRAMEWORK_LIB).expect("found");
        assert_eq!(
            lib.host_path,
            std::path::PathBuf::from("/proc/1/root/x/libtensorflow_framework.so.2")
        );
        assert_eq!(lib.path, "/x/libtensorflow_framework.so.2");
    }

    #[test]
    fn self_is_alive_and_has_cpu() {
        let me = std::process::id() as i32;
        assert!(alive(me));
        assert!(process_cpu_ns(me).is_some());
        assert!(machine_busy_ns().is_some_and(|b| b > 0));
    }
}
