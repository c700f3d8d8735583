//! The TensorFlow hooks: definitions of TensorFlow's own exported symbols
//! that record, then forward to the real function with the same arguments.
//!
//! They are `extern "C-unwind"`: should C++ code below throw, the exception
//! passes through (an `extern "C"` frame would abort the program). Nothing
//! here can panic: no indexing without a check, no allocation.

use core::ffi::c_void;
use core::sync::atomic::Ordering;

use crate::abi::{self, Header};
use crate::real::Real;
use crate::shm;

const FRAMEWORK: &[u8] = b"libtensorflow_framework.so.2";

static GET_NEXT: Real = Real::new(
    c"_ZN10tensorflow4data19DatasetBaseIterator7GetNextEPNS0_15IteratorContextEPSt6vectorINS_6TensorESaIS5_EEPb",
    FRAMEWORK,
);
static REMOVE_NODE: Real = Real::new(
    c"_ZN10tensorflow4data5model5Model10RemoveNodeESt10shared_ptrINS1_4NodeEE",
    FRAMEWORK,
);

static RECORD_STOP: Real = Real::new(c"_ZN10tensorflow4data5model4Node11record_stopEl", FRAMEWORK);
// CPython: the interpreter's own calls stay inside libpython (built with
// -fno-semantic-interposition), but extension modules' (TensorFlow's
// py_function, its ALLOW_THREADS blocks) go through their PLT, here.
static RESTORE_THREAD: Real = Real::new(c"PyEval_RestoreThread", b"");
static GIL_ENSURE: Real = Real::new(c"PyGILState_Ensure", b"");
static GIL_RELEASE: Real = Real::new(c"PyGILState_Release", b"");

type RecordStopFn = unsafe extern "C-unwind" fn(*mut c_void, i64);
type RestoreThreadFn = unsafe extern "C-unwind" fn(*mut c_void);
type GilEnsureFn = unsafe extern "C-unwind" fn() -> i32;
type GilReleaseFn = unsafe extern "C-unwind" fn(i32);

type GetNextFn = unsafe extern "C-unwind" fn(
    *mut c_void,
    *mut c_void,
    *mut c_void,
    *mut c_void,
    *mut c_void,
) -> *mut c_void;
type RemoveNodeFn = unsafe extern "C-unwind" fn(*mut c_void, *mut c_void);

/// No real function to forward to: TensorFlow called a symbol it does not
/// define itself, which cannot happen with a library it was built with.
/// There is no way to run the call, so stop the way C++ would.
#[cold]
fn missing(what: &[u8]) -> ! {
    // SAFETY: writing a static buffer to stderr, then aborting.
    unsafe {
        libc::write(2, b"plumber-shim: real ".as_ptr().cast(), 19);
        libc::write(2, what.as_ptr().cast(), what.len());
        libc::write(2, b" not found\n".as_ptr().cast(), 11);
        libc::abort()
    }
}

/// `absl::Status DatasetBaseIterator::GetNext(IteratorContext*,
/// std::vector<Tensor>*, bool*)`. The Status is returned through a hidden
/// pointer: the registers are (sret, this, ctx, out, eos) and the sret
/// pointer comes back in rax, which this signature reproduces exactly.
///
/// # Safety
/// Called by TensorFlow with its own arguments, which are passed on as is.
#[export_name = "_ZN10tensorflow4data19DatasetBaseIterator7GetNextEPNS0_15IteratorContextEPSt6vectorINS_6TensorESaIS5_EEPb"]
pub unsafe extern "C-unwind" fn get_next(
    sret: *mut c_void,
    this: *mut c_void,
    ctx: *mut c_void,
    out: *mut c_void,
    eos: *mut c_void,
) -> *mut c_void {
    let f = GET_NEXT.get();
    if f.is_null() {
        missing(b"DatasetBaseIterator::GetNext");
    }
    // SAFETY: a non-null address dlsym returned for this very symbol.
    let f: GetNextFn = unsafe { core::mem::transmute::<*mut c_void, GetNextFn>(f) };
    let owned = shm::owned(true);
    if let Some(h) = owned {
        if h.discover.load(Ordering::Relaxed) != 0 {
            publish_iterator(h, this as u64);
        }
        // Reads below this call are this iterator's (innermost wins).
        crate::thread::push_iter(this as u64);
    }
    // SAFETY: forwarding TensorFlow's own arguments to the real function.
    let r = unsafe { f(sret, this, ctx, out, eos) };
    if owned.is_some() {
        crate::thread::pop_iter();
    }
    r
}

/// Adds `this` to the discovery table (open addressing, a CAS claims a
/// free slot), or counts a drop when its probe run is full.
fn publish_iterator(h: &Header, this: u64) {
    if this == 0 {
        return;
    }
    const PROBES: usize = 32;
    let start = (this >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
    for i in 0..PROBES {
        let idx = (start as usize).wrapping_add(i) % abi::ITER_SLOTS;
        let Some(slot) = h.iters.get(idx) else {
            return;
        };
        let cur = slot.this.load(Ordering::Relaxed);
        if cur == this {
            slot.calls.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if cur == 0 {
            match slot
                .this
                .compare_exchange(0, this, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    slot.calls.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(other) if other == this => {
                    slot.calls.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(_) => continue,
            }
        }
    }
    h.drops[abi::DROP_ITER_TABLE_FULL].fetch_add(1, Ordering::Relaxed);
}

/// `void Model::RemoveNode(std::shared_ptr<Node>)`: the shared_ptr is not
/// trivially copyable, so it is passed by address: (this, &node).
///
/// # Safety
/// Called by TensorFlow with its own arguments, which are passed on as is.
#[export_name = "_ZN10tensorflow4data5model5Model10RemoveNodeESt10shared_ptrINS1_4NodeEE"]
pub unsafe extern "C-unwind" fn remove_node(model: *mut c_void, node: *mut c_void) {
    let f = REMOVE_NODE.get();
    if f.is_null() {
        missing(b"Model::RemoveNode");
    }
    // SAFETY: a non-null address dlsym returned for this very symbol.
    let f: RemoveNodeFn = unsafe { core::mem::transmute::<*mut c_void, RemoveNodeFn>(f) };
    if let Some(h) = shm::owned(true) {
        // Reading the node is a system call: rare, timed in full.
        let span = crate::thread::HookSpan::start();
        crate::retired::record(h, node);
        span.end(h);
    }
    // SAFETY: forwarding TensorFlow's own arguments to the real function.
    unsafe { f(model, node) }
}

/// `void model::Node::record_stop(int64_t time_nanos)`: (this, time).
///
/// # Safety
/// Called by TensorFlow with its own arguments, which are passed on as is.
#[export_name = "_ZN10tensorflow4data5model4Node11record_stopEl"]
pub unsafe extern "C-unwind" fn record_stop(node: *mut c_void, time_nanos: i64) {
    let f = RECORD_STOP.get();
    if f.is_null() {
        missing(b"model::Node::record_stop");
    }
    // SAFETY: a non-null address dlsym returned for this very symbol.
    let f: RecordStopFn = unsafe { core::mem::transmute::<*mut c_void, RecordStopFn>(f) };
    if let Some(h) = shm::owned(true) {
        crate::thread::on_record_stop(h, node as u64);
    }
    // SAFETY: forwarding TensorFlow's own arguments to the real function.
    unsafe { f(node, time_nanos) }
}

/// `void PyEval_RestoreThread(PyThreadState*)`: takes the GIL back; the
/// time it takes is GIL wait.
///
/// # Safety
/// Called by an extension module with its own argument, passed on as is.
#[no_mangle]
#[allow(non_snake_case)]
pub unsafe extern "C-unwind" fn PyEval_RestoreThread(tstate: *mut c_void) {
    let f = RESTORE_THREAD.get();
    if f.is_null() {
        missing(b"PyEval_RestoreThread");
    }
    // SAFETY: a non-null address dlsym returned for this very symbol.
    let f: RestoreThreadFn = unsafe { core::mem::transmute::<*mut c_void, RestoreThreadFn>(f) };
    let h = shm::owned(false).filter(|_| !crate::thread::in_py());
    let t0 = h.map(|_| crate::clock::clock_ns(libc::CLOCK_MONOTONIC));
    // SAFETY: forwarding the caller's argument to the real function.
    unsafe { f(tstate) };
    if let (Some(h), Some(t0)) = (h, t0) {
        let dt = crate::clock::clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(t0);
        crate::thread::on_gil_wait(h, dt);
        crate::thread::add_hook_ns(h, crate::cost::reads_ns(2, 0));
    }
}

/// `PyGILState_STATE PyGILState_Ensure(void)` (an enum: int): how
/// TensorFlow's py_function takes the GIL from a pool thread. The wait is
/// measured from here to the matching `PyGILState_Release` (see
/// `thread::py_leave`).
///
/// # Safety
/// Called by an extension module; no arguments.
#[no_mangle]
#[allow(non_snake_case)]
pub unsafe extern "C-unwind" fn PyGILState_Ensure() -> i32 {
    let f = GIL_ENSURE.get();
    if f.is_null() {
        missing(b"PyGILState_Ensure");
    }
    // SAFETY: a non-null address dlsym returned for this very symbol.
    let f: GilEnsureFn = unsafe { core::mem::transmute::<*mut c_void, GilEnsureFn>(f) };
    if shm::owned(false).is_some() {
        crate::thread::py_enter();
    }
    // SAFETY: calling the real function.
    unsafe { f() }
}

/// `void PyGILState_Release(PyGILState_STATE)`.
///
/// # Safety
/// Called by an extension module with its own argument, passed on as is.
#[no_mangle]
#[allow(non_snake_case)]
pub unsafe extern "C-unwind" fn PyGILState_Release(state: i32) {
    let f = GIL_RELEASE.get();
    if f.is_null() {
        missing(b"PyGILState_Release");
    }
    // SAFETY: a non-null address dlsym returned for this very symbol.
    let f: GilReleaseFn = unsafe { core::mem::transmute::<*mut c_void, GilReleaseFn>(f) };
    // SAFETY: forwarding the caller's argument to the real function.
    unsafe { f(state) };
    if let Some(h) = shm::owned(false) {
        crate::thread::py_leave(h);
    }
}
