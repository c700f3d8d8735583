//! `plumber-probe py-objects` (hidden): reads Python objects of a live
//! process from outside and prints them as JSON, for the end-to-end tests
//! of `python::Objects` and for looking at a target by hand.

use std::process::ExitCode;

use serde_json::{json, Value};

use crate::python::{Found, ObjError, Objects, PyProcess, PyValue, Storage};
use crate::torch::gil::Wait;

#[derive(clap::Args, Debug)]
pub struct PyObjectsArgs {
    /// PID of a Python 3.9-3.13 process.
    #[arg(short, long)]
    pid: i32,
    /// `ADDR` or `ADDR:PATH` (hex address, then attributes and [i]
    /// indices: `0x7f..:_workers[0]._popen.pid`): the value there.
    #[arg(long)]
    read: Vec<String>,
    /// A type name: the objects of that type the threads' frames hold.
    #[arg(long)]
    find: Vec<String>,
    /// Look at the threads this many times, 20 ms apart: each one's
    /// `thread_id`, kernel id and whether it waited for the GIL.
    #[arg(long, default_value_t = 0)]
    thread_samples: u32,
}

pub fn run(a: &PyObjectsArgs) -> anyhow::Result<ExitCode> {
    let py = PyProcess::attach(a.pid)?;
    let objs = Objects::new(&py)?;
    let reads: Vec<Value> = a
        .read
        .iter()
        .map(|spec| match read(&objs, spec) {
            Ok(v) => v,
            Err(e) => json!({"spec": spec, "error": e.to_string()}),
        })
        .collect();
    let names: Vec<&str> = a.find.iter().map(String::as_str).collect();
    let found: Vec<Value> = if names.is_empty() {
        Vec::new()
    } else {
        objs.find_on_frames(&names)?
            .into_iter()
            .map(|f: Found| {
                json!({
                    "addr": format!("{:#x}", f.addr),
                    "type": f.type_name,
                    "function": f.function,
                    "via": f.via,
                    "thread_id": f.thread_id,
                })
            })
            .collect()
    };
    let threads = thread_samples(&py, a.thread_samples);
    let out =
        json!({"minor": py.offsets.minor, "reads": reads, "found": found, "threads": threads});
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(ExitCode::SUCCESS)
}

/// The threads as the DataLoader's stage sampler sees them, `n` times.
fn thread_samples(py: &PyProcess, n: u32) -> Vec<Value> {
    let mut frames = crate::torch::frames::Frames::new(py);
    (0..n)
        .map(|i| {
            if i > 0 {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let stacks = frames.stacks().unwrap_or_default();
            Value::Array(
                stacks
                    .iter()
                    .map(|s| {
                        let wait = frames.wait(s);
                        json!({
                            "thread_id": s.thread_id,
                            "tid": s.tid,
                            "gil_wait": wait.map(|w| w == Wait::Gil),
                            "lock_wait": wait.map(|w| w == Wait::Lock),
                            "function": s.frames.last().map(|f| f.0.to_string()),
                        })
                    })
                    .collect(),
            )
        })
        .collect()
}

fn read(objs: &Objects, spec: &str) -> Result<Value, ObjError> {
    let (addr, path) = spec.split_once(':').unwrap_or((spec, ""));
    let addr = u64::from_str_radix(addr.trim_start_matches("0x"), 16)
        .map_err(|_| ObjError::Path(spec.to_string()))?;
    // Where the last attribute was found, when the path ends in one.
    let (obj, storage) = match path.rsplit_once('.') {
        Some((head, last)) if !last.contains(['[', ']']) => {
            let owner = objs.follow(addr, head)?;
            let (v, s) = objs
                .attr_in(owner, last)?
                .ok_or_else(|| ObjError::NoAttribute(owner, last.to_string()))?;
            (v, Some(Storage::name(s)))
        }
        _ if !path.is_empty() && !path.contains(['.', '[']) => {
            let (v, s) = objs
                .attr_in(addr, path)?
                .ok_or_else(|| ObjError::NoAttribute(addr, path.to_string()))?;
            (v, Some(Storage::name(s)))
        }
        _ => (objs.follow(addr, path)?, None),
    };
    let hex = |v: &[u64]| v.iter().map(|a| format!("{a:#x}")).collect::<Vec<_>>();
    let value = match objs.value(obj)? {
        PyValue::None => json!({"kind": "none"}),
        PyValue::Bool(b) => json!({"kind": "bool", "bool": b}),
        PyValue::Int(i) => json!({"kind": "int", "int": i.to_string()}),
        PyValue::Float(f) => json!({"kind": "float", "bits": f.to_bits().to_string(), "float": f}),
        PyValue::Str(s) => json!({"kind": "str", "str": s}),
        PyValue::List(v) => json!({"kind": "list", "items": hex(&v)}),
        PyValue::Tuple(v) => json!({"kind": "tuple", "items": hex(&v)}),
        PyValue::Other(_) => json!({"kind": "other"}),
    };
    Ok(json!({
        "spec": spec,
        "addr": format!("{obj:#x}"),
        "type": objs.type_name(obj)?,
        "value": value,
        "storage": storage,
    }))
}
