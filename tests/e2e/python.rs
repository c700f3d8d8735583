//! Python frames in sampled stacks, against the interpreter's own view:
//! tests/workloads/py_spin.py (pure Python) prints traceback.format_stack()
//! from its innermost function and spins there; `plumber-probe stacks`
//! samples it. For every CPython from 3.9 to 3.13 (pyenv's, in root's
//! home as CI has them: a missing one fails the test) the sampled Python
//! frames must be the traceback's functions, in its order, in its files.
//! And an interpreter that cannot be read safely gives native stacks and
//! one line saying so, never wrong names.

use std::path::PathBuf;

use crate::harness::*;

pub const VERSIONS: &[&str] = &["3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0"];

pub fn pyenv_python(version: &str) -> PathBuf {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root/.pyenv"));
    let p = root.join("versions").join(version).join("bin/python3");
    assert!(
        p.exists(),
        "{} missing: install it with `pyenv install {version}` (CI has it)",
        p.display()
    );
    p
}

/// A Python frame of a folded stack: (function, file, line).
fn py_frame(f: &str) -> Option<(String, String, Option<u32>)> {
    let (func, rest) = f.split_once(" (")?;
    let inner = rest.strip_suffix(')')?;
    if !inner.contains(".py") {
        return None;
    }
    Some(match inner.rsplit_once(':') {
        Some((file, line)) if line.parse::<u32>().is_ok() => {
            (func.to_string(), file.to_string(), line.parse().ok())
        }
        _ => (func.to_string(), inner.to_string(), None),
    })
}

/// The traceback the workload printed, outermost first: (function, file
/// name, line).
fn traceback(lines: &[String]) -> Vec<(String, String, u32)> {
    lines
        .iter()
        .filter_map(|l| {
            let l = l.trim().strip_prefix("File \"")?;
            let (path, rest) = l.split_once("\", line ")?;
            let (line, func) = rest.split_once(", in ")?;
            let file = path.rsplit('/').next()?.to_string();
            Some((func.to_string(), file, line.parse().ok()?))
        })
        .collect()
}

/// `plumber-probe stacks` on a process: its folded lines and stderr.
fn sample(pid: i32, extra: &[&str]) -> (Vec<(u32, Vec<String>, u64)>, String) {
    let pid = pid.to_string();
    let mut args = vec![
        "stacks",
        "--pid",
        &pid,
        "--duration",
        "3",
        "--sample-hz",
        "99",
    ];
    args.extend_from_slice(extra);
    let o = run_probe(&args);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "plumber-probe stacks failed: {stderr}");
    let stacks = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let (stack, n) = l.rsplit_once(' ')?;
            let mut frames = stack.split(';');
            let tid = frames.next()?.strip_prefix("tid ")?.parse().ok()?;
            Some((tid, frames.map(String::from).collect(), n.parse().ok()?))
        })
        .collect();
    (stacks, stderr)
}

/// Samples py_spin.py under `python` and compares its main thread's
/// Python frames with the traceback it printed.
fn check_against_traceback(python: &std::path::Path, what: &str) {
    let w = Workload::start_in(&[], python, "py_spin.py", &[]);
    let want = traceback(&w.snapshot_lines());
    assert!(
        want.len() >= 5,
        "{what}: no traceback in {:?}",
        w.snapshot_lines()
    );
    let (stacks, stderr) = sample(w.pid, &[]);
    assert!(
        stderr.contains("Python frames in stacks"),
        "{what}: interpreter not read: {stderr}"
    );
    let (mut main, mut full) = (0u64, 0u64);
    for (tid, frames, n) in stacks.iter().filter(|s| s.0 == w.pid as u32) {
        let got: Vec<_> = frames.iter().filter_map(|f| py_frame(f)).collect();
        main += n;
        assert!(
            !frames
                .iter()
                .any(|f| f.contains("_PyEval_EvalFrameDefault")),
            "{what}: an eval loop frame left in tid {tid}: {frames:?}"
        );
        // Every frame where the traceback has it: same function, same
        // file; the callers' lines too (the leaf moves within its loop).
        assert!(
            got.len() <= want.len(),
            "{what}: extra frames {got:?} vs {want:?}"
        );
        for (i, (g, t)) in got.iter().zip(&want).enumerate() {
            // The traceback prints the code object's own name; the frame
            // its qualified name on 3.11+ (`Worker.run`), ending in it.
            assert_eq!(
                (own_name(&g.0), &g.1),
                (t.0.as_str(), &t.1),
                "{what}: frame {i} of {got:?} vs {want:?}"
            );
            if i + 1 < got.len() {
                assert_eq!(g.2, Some(t.2), "{what}: line of frame {i} in {got:?}");
            }
        }
        if got.len() == want.len() {
            full += n;
        }
    }
    assert!(main >= 20, "{what}: {main} samples of the main thread");
    assert!(
        full * 10 >= main * 8,
        "{what}: {full} of {main} main-thread samples carry the whole traceback"
    );
    // The second thread: its own functions, under threading's.
    let worker: Vec<_> = stacks
        .iter()
        .filter(|s| s.0 != w.pid as u32)
        .flat_map(|s| s.1.iter().filter_map(|f| py_frame(f)))
        .map(|f| (f.0, f.1))
        .collect();
    let qualified = qualified_names(python);
    for want in [
        ("Worker.run", "py_spin.py"),
        ("Worker.step", "py_spin.py"),
        ("Thread._bootstrap", "threading.py"),
    ] {
        let name = if qualified { want.0 } else { own_name(want.0) };
        assert!(
            worker.iter().any(|(f, file)| f == name && file == want.1),
            "{what}: no {:?} in the worker's frames {worker:?}",
            (name, want.1)
        );
    }
}

/// The code object's own name in a frame's function: the last part of a
/// qualified name.
fn own_name(f: &str) -> &str {
    f.rsplit('.').next().unwrap_or(f)
}

/// Whether frames carry qualified names under `python` (CPython 3.11+).
fn qualified_names(python: &std::path::Path) -> bool {
    let o = std::process::Command::new(python)
        .args(["-c", "import sys; print(sys.version_info >= (3, 11))"])
        .output()
        .expect("python runs");
    String::from_utf8_lossy(&o.stdout).trim() == "True"
}

#[test]
fn sampled_python_frames_match_the_traceback_3_9_to_3_13() {
    require_root();
    for v in VERSIONS {
        check_against_traceback(&pyenv_python(v), &format!("CPython {v} (libpython)"));
    }
}

/// CPython built into the python executable (no libpython): Debian's
/// /usr/bin/python3 is, where the machine has one of 3.9-3.13.
#[test]
fn sampled_python_frames_of_a_static_interpreter() {
    require_root();
    let Ok(p) = std::fs::canonicalize("/usr/bin/python3") else {
        eprintln!("no /usr/bin/python3: the static build is not available here");
        return;
    };
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let minor: u32 = name
        .strip_prefix("python3.")
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if !(9..=13).contains(&minor) {
        eprintln!("{} is not 3.9-3.13: not tested", p.display());
        return;
    }
    let ldd = std::process::Command::new("ldd")
        .arg(&p)
        .output()
        .expect("ldd");
    if String::from_utf8_lossy(&ldd.stdout).contains("libpython") {
        eprintln!("{} links libpython: covered by the pyenv test", p.display());
        return;
    }
    check_against_traceback(&p, &format!("{} (static)", p.display()));
}

/// Offsets that are wrong, and a version without offsets: native stacks as
/// without Python frames, one line on stderr, no names made up.
#[test]
fn unreadable_interpreters_give_native_stacks_and_one_line() {
    require_root();
    let cases: [(PathBuf, &[&str], &str); 2] = [
        (
            pyenv_python("3.11.7"),
            &["--skew-python-offsets"],
            "do not look as expected",
        ),
        (pyenv_python("3.8.18"), &[], "CPython 3.8 is not supported"),
    ];
    for (python, extra, why) in cases {
        let w = Workload::start_in(&[], &python, "py_spin.py", &[]);
        let (stacks, stderr) = sample(w.pid, extra);
        let notes: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("python:"))
            .collect();
        assert_eq!(notes.len(), 1, "one line about Python: {stderr}");
        assert!(
            notes[0].starts_with("python: native frames only (") && notes[0].contains(why),
            "{}",
            notes[0]
        );
        let total: u64 = stacks.iter().map(|s| s.2).sum();
        assert!(total >= 10, "{total} samples");
        for (_, frames, _) in &stacks {
            assert!(
                frames.iter().all(|f| py_frame(f).is_none()),
                "a Python frame with an unreadable interpreter: {frames:?}"
            );
        }
        // Native frames as today: the interpreter's eval loop is there.
        assert!(
            stacks
                .iter()
                .any(|s| s.1.iter().any(|f| f.contains("_PyEval_EvalFrameDefault"))),
            "no native interpreter frames: {stacks:?}"
        );
    }
}

/// The line range of `def NAME(` in a workload, to its last line (the
/// next line at the same or a lower indent).
fn function_lines(script: &str, name: &str) -> std::ops::RangeInclusive<u32> {
    let text =
        std::fs::read_to_string(repo().join("tests/workloads").join(script)).expect("script");
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_start().starts_with(&format!("def {name}(")))
        .expect("def");
    let indent = lines[start].len() - lines[start].trim_start().len();
    let end = lines[start + 1..]
        .iter()
        .position(|l| !l.trim().is_empty() && l.len() - l.trim_start().len() <= indent)
        .map_or(lines.len(), |n| start + 1 + n);
    (start as u32 + 1)..=(end as u32)
}

/// tf.py_function with a heavy UDF (300,000 iterations an element): the
/// map op's on-CPU samples carry the UDF's frame, with its file and a
/// line of its body, under PyFuncOp::Compute; the main thread's carry the
/// training loop; locks.folded has GIL waits inside the UDF, under
/// PyFuncOp::Compute under the map op.
#[test]
fn python_frames_on_the_py_function_workload() {
    require_root();
    let w = Workload::start("py_function.py", &["--pyiters", "300000"]);
    let out = tempdir("python-pyfunc");
    let pid = w.pid.to_string();
    let o = run_probe(&[
        "--pid",
        &pid,
        "--duration",
        "8",
        "--output",
        out.to_str().expect("utf8"),
        "-q",
        // The main thread mostly waits for the map: at 49 Hz an 8 s
        // recording can hold none of its samples (seen in CI).
        "--sample-hz",
        "999",
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("python: CPython 3.") && l.contains("Python frames")),
        "{stdout}"
    );
    let body = function_lines("py_function.py", "py_loop");
    let udf = |s: &str| {
        s.split(';').any(|f| {
            // `build.<locals>.py_loop` on 3.11+.
            py_frame(f).is_some_and(|(func, file, line)| {
                own_name(&func) == "py_loop"
                    && file == "py_function.py"
                    && line.is_some_and(|l| body.contains(&l))
            })
        })
    };
    let read = |name: &str| -> Vec<(String, u64)> {
        std::fs::read_to_string(out.join(name))
            .expect("folded")
            .lines()
            .filter_map(|l| {
                let (s, n) = l.rsplit_once(' ')?;
                Some((s.to_string(), n.parse().ok()?))
            })
            .collect()
    };
    let cpu = read("cpu.folded");
    let sum = |v: &[(String, u64)], f: &dyn Fn(&str) -> bool| -> u64 {
        v.iter().filter(|(s, _)| f(s)).map(|(_, n)| n).sum()
    };
    let map = sum(&cpu, &|s| s.starts_with("[ParallelMapV2];"));
    let map_udf = sum(&cpu, &|s| {
        s.starts_with("[ParallelMapV2];") && s.contains("PyFuncOp::Compute") && udf(s)
    });
    eprintln!("map op: {map_udf} of {map} ns on CPU carry py_loop");
    assert!(map > 0, "no map op samples");
    assert!(
        map_udf as f64 >= 0.9 * map as f64,
        "{map_udf} of {map} ns of the map op's samples carry the UDF's frame"
    );
    let main = sum(&cpu, &|s| {
        !s.starts_with("[ParallelMapV2];") && s.contains(";_start;")
    });
    let main_loop = sum(&cpu, &|s| {
        !s.starts_with("[ParallelMapV2];")
            && s.contains(";_start;")
            && s.contains(";run (common.py:")
    });
    eprintln!("main thread: {main_loop} of {main} ns in the training loop");
    assert!(
        main > 0 && main_loop as f64 >= 0.8 * main as f64,
        "{main_loop} of {main}"
    );
    let locks = read("locks.folded");
    let gil_in_udf = sum(&locks, &|s| {
        s.starts_with("[ParallelMapV2];")
            && s.ends_with(";[lock: gil]")
            && s.contains("PyFuncOp::Compute")
            && udf(s)
    });
    assert!(
        gil_in_udf > 0,
        "no GIL wait inside the UDF under PyFuncOp::Compute"
    );
    let svg = std::fs::read_to_string(out.join("locks.svg")).expect("locks.svg");
    assert!(
        svg.contains("py_loop (py_function.py:"),
        "locks.svg lacks the UDF"
    );
    check_offcpu_python_frames(&read("offcpu.folded"));
}

/// offcpu.folded of the py_function workload (the stacks copied when a
/// thread goes to sleep): the main thread, blocked in the iterator, sits
/// under the training loop's Python frame, and no stack that carries
/// Python frames keeps an interpreter frame they replaced.
fn check_offcpu_python_frames(offcpu: &[(String, u64)]) {
    let sum = |f: &dyn Fn(&str) -> bool| -> u64 {
        offcpu.iter().filter(|(s, _)| f(s)).map(|(_, n)| n).sum()
    };
    let has_py = |s: &str| s.split(';').any(|f| py_frame(f).is_some());
    let main = sum(&|s| !s.starts_with("[ParallelMapV2];") && s.contains(";_start;"));
    let main_loop = sum(&|s| {
        !s.starts_with("[ParallelMapV2];")
            && s.contains(";_start;")
            && s.contains(";run (common.py:")
    });
    let with_py = sum(&|s| has_py(s));
    let total = sum(&|_| true);
    eprintln!(
        "off CPU: main thread {main_loop} of {main} ns in the training loop; \
         {with_py} of {total} ns with Python frames"
    );
    // Block copies are sampled (one per thread per PP_BLOCK_COPY_GAP_NS):
    // the main thread, blocked once per element of a slow map, may have
    // none in a window (seen once in CI: 0 of 0 ns). Where it has some,
    // they must sit under the training loop.
    if main == 0 {
        eprintln!("no off-CPU copy of the main thread in this window: nothing to check there");
    }
    assert!(
        main_loop as f64 >= 0.8 * main as f64,
        "main thread off CPU: {main_loop} of {main} ns under the training loop"
    );
    let left: Vec<&String> = offcpu
        .iter()
        .map(|(s, _)| s)
        .filter(|s| has_py(s) && s.contains("_PyEval_EvalFrameDefault"))
        .collect();
    assert!(
        left.is_empty(),
        "interpreter frames left beside Python frames: {left:#?}"
    );
}

/// A target in its own mount namespace (a container's view): its
/// interpreter's file exists only there, and is read through
/// /proc/PID/root. The static build, bind-mounted on a directory that is
/// empty outside.
#[test]
fn python_frames_through_the_targets_root() {
    require_root();
    let Ok(p) = std::fs::canonicalize("/usr/bin/python3") else {
        eprintln!("no /usr/bin/python3: not tested here");
        return;
    };
    let dir = p.parent().expect("bin dir");
    let name = p.file_name().and_then(|n| n.to_str()).expect("name");
    let (w, inside, py) = Workload::start_behind_bind_mount(dir, "nspy", name, "py_spin.py", &[]);
    assert!(!py.exists(), "{} seen outside the namespace", py.display());
    let (stacks, stderr) = sample(w.pid, &[]);
    drop(w);
    let _ = std::fs::remove_dir(&inside);
    assert!(
        stderr.contains("Python frames in stacks")
            && stderr.contains(inside.to_str().expect("utf8")),
        "{stderr}"
    );
    assert!(
        stacks
            .iter()
            .any(|s| s.1.iter().any(|f| f.starts_with("leaf_spin (py_spin.py:"))),
        "no leaf_spin frame: {stacks:?}"
    );
}

/// A program that maps a libpython and runs no interpreter in it, as an
/// embedding program does before `Py_Initialize` (and a job after its
/// interpreter was finalized): prints its pid, then waits.
const NO_INTERPRETER_C: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc < 2 || !dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) return 1;
    printf("READY %d\n", getpid());
    fflush(stdout);
    sleep(60);
    return 0;
}
"#;

/// A process whose libpython runs no interpreter gets one line that says
/// so and how to go on. Before, it was told as CPython's layout not
/// looking as expected ("no interpreter state"), seen once attaching to a
/// job as it exited.
#[test]
fn a_process_with_no_interpreter_running_says_so() {
    require_root();
    let python = pyenv_python("3.11.7");
    let prefix = python
        .parent()
        .and_then(|b| b.parent())
        .expect("pyenv prefix");
    let lib = prefix.join("lib/libpython3.11.so.1.0");
    let dir = tempdir("no-interpreter");
    let (src, bin) = (dir.join("noinit.c"), dir.join("noinit"));
    std::fs::write(&src, NO_INTERPRETER_C).expect("write the C source");
    let built = std::process::Command::new("clang")
        .args(["-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .arg("-ldl")
        .status()
        .expect("clang");
    assert!(built.success(), "clang failed");
    let mut child = std::process::Command::new(&bin)
        .arg(&lib)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the program");
    let mut line = String::new();
    let out = child.stdout.take().expect("stdout");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line).expect("READY");
    assert!(line.starts_with("READY"), "{line}");
    let o = run_probe(&["py-objects", "--pid", &child.id().to_string()]);
    let _ = child.kill();
    let _ = child.wait();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("no Python interpreter runs in it now")
            && lines[0].contains("attach once the job runs"),
        "{stderr}"
    );
}
