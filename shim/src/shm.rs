//! The shared memory as this process sees it: mapped once at load time
//! from the file the parent named in the environment, claimed by the first
//! process that runs TensorFlow code, ignored by forked children.

use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use crate::abi::{self, Header};

static HEADER: AtomicPtr<Header> = AtomicPtr::new(ptr::null_mut());
/// Set in a forked child (pthread_atfork): its memory is a copy of the
/// parent's, but its calls are not the recorded process's.
static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_fork_child() {
    FORKED.store(true, Ordering::Relaxed);
}

/// Runs when the library is loaded (before `main`), single-threaded.
extern "C" fn init() {
    // SAFETY: getenv with a NUL-terminated name; the result is only read
    // here, before any other thread exists to call setenv.
    let path = unsafe { libc::getenv(c"PLUMBER_SHIM_SHM".as_ptr()) };
    if path.is_null() {
        return;
    }
    // SAFETY: `path` is a NUL-terminated string from the environment.
    let fd = unsafe { libc::open(path, libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return;
    }
    // SAFETY: mapping a file descriptor we own, shared, of the size the
    // ABI fixes; the result is checked before use.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            abi::HEADER_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    // SAFETY: closing our own descriptor; the mapping stays valid.
    unsafe { libc::close(fd) };
    if p == libc::MAP_FAILED {
        return;
    }
    let h = p.cast::<Header>();
    // SAFETY: the mapping is HEADER_SIZE bytes of atomics (any bit pattern
    // is valid) and lives until the process ends (never unmapped).
    let hr = unsafe { &*h };
    if hr.magic.load(Ordering::Acquire) != abi::MAGIC
        || hr.version.load(Ordering::Relaxed) != abi::VERSION
        || hr.size.load(Ordering::Relaxed) as usize != abi::HEADER_SIZE
    {
        // Another build of the probe: reading each other's tables would
        // give garbage, so stay inert.
        return;
    }
    // SAFETY: registering a plain function that only stores an atomic.
    if unsafe { libc::pthread_atfork(None, None, Some(on_fork_child)) } != 0 {
        return;
    }
    crate::cost::calibrate();
    HEADER.store(h, Ordering::Release);
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// The shared memory, if this process is the one being recorded. The first
/// call from a TensorFlow hook claims it (`claim`); other hooks (CPython's,
/// called by any extension module) only use a claim already made, so a
/// Python launcher without TensorFlow does not take the recording from the
/// program it starts.
#[inline]
pub fn owned(may_claim: bool) -> Option<&'static Header> {
    let h = HEADER.load(Ordering::Acquire);
    if h.is_null() || FORKED.load(Ordering::Relaxed) {
        return None;
    }
    // SAFETY: set once in init() to a live, never-unmapped mapping of a
    // Header made only of atomics.
    let h = unsafe { &*h };
    match h.state.load(Ordering::Acquire) {
        abi::STATE_ACTIVE => {}
        abi::STATE_WAITING if may_claim => claim(h)?,
        _ => return None,
    }
    if h.owner_pid.load(Ordering::Relaxed) == pid() {
        Some(h)
    } else {
        h.drops[abi::DROP_OTHER_PROCESS].fetch_add(1, Ordering::Relaxed);
        None
    }
}

fn claim(h: &Header) -> Option<()> {
    let me = pid();
    if h.owner_pid
        .compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
    {
        h.state.store(abi::STATE_ACTIVE, Ordering::Release);
    }
    Some(())
}

/// This process's pid, cached: the value only changes across fork, and a
/// forked child never gets here (FORKED).
fn pid() -> i32 {
    use core::sync::atomic::AtomicI32;
    static PID: AtomicI32 = AtomicI32::new(0);
    let p = PID.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: getpid has no preconditions.
    let p = unsafe { libc::getpid() };
    PID.store(p, Ordering::Relaxed);
    p
}
