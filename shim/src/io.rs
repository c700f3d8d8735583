//! libc file I/O: `open*`, `read`, `pread`/`pread64`, `readv`,
//! `preadv`/`preadv64`, `close`.
//! Files opened by the recorded process are followed by descriptor; each
//! read is booked to (thread, file, op), the op being the innermost
//! iterator whose GetNext runs on the thread. Reads are rare and large in
//! tf.data (256 KiB per TFRecord read), so naming the op costs one
//! process_vm_readv of the iterator's prefix per read, on followed files
//! only; every other call costs a table lookup.

use core::ffi::{c_char, c_int, c_uint, c_void, CStr};
use core::sync::atomic::Ordering;

use crate::abi::{self, Header, IoRow};
use crate::clock::clock_ns;
use crate::cost;
use crate::real::Real;
use crate::retired::read_self;
use crate::shm;
use crate::thread::{self, HookSpan};

static OPEN: Real = Real::new(c"open", b"");
static OPEN64: Real = Real::new(c"open64", b"");
static OPENAT: Real = Real::new(c"openat", b"");
static OPENAT64: Real = Real::new(c"openat64", b"");
static CLOSE: Real = Real::new(c"close", b"");
static READ: Real = Real::new(c"read", b"");
static PREAD: Real = Real::new(c"pread", b"");
static PREAD64: Real = Real::new(c"pread64", b"");
static PREADV64: Real = Real::new(c"preadv64", b"");
static READV: Real = Real::new(c"readv", b"");
static PREADV: Real = Real::new(c"preadv", b"");

type OpenFn = unsafe extern "C" fn(*const c_char, c_int, ...) -> c_int;
type OpenatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, ...) -> c_int;
type CloseFn = unsafe extern "C" fn(c_int) -> c_int;
type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, usize) -> isize;
type PreadFn = unsafe extern "C" fn(c_int, *mut c_void, usize, i64) -> isize;
type ReadvFn = unsafe extern "C" fn(c_int, *const libc::iovec, c_int) -> isize;
type PreadvFn = unsafe extern "C" fn(c_int, *const libc::iovec, c_int, i64) -> isize;

/// The real function, or -1/ENOSYS if libc has none (cannot happen with
/// glibc, but a missing libc function must not crash the program).
macro_rules! real {
    ($r:expr, $t:ty, $fail:expr) => {{
        let a = $r.get();
        if a.is_null() {
            // SAFETY: errno is thread-local and always writable.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            return $fail;
        }
        // SAFETY: a non-null address dlsym returned for this very symbol,
        // whose C prototype is `$t`.
        unsafe { core::mem::transmute::<*mut c_void, $t>(a) }
    }};
}

fn fnv(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

/// Slot of `path`, claimed on first open.
fn file_slot(h: &Header, path: &[u8], size: u64) -> Option<u32> {
    let hash = fnv(path, FNV0).max(1);
    let start = (hash as usize) % abi::FILE_SLOTS;
    for k in 0..abi::FILE_SLOTS {
        let i = (start + k) % abi::FILE_SLOTS;
        let s = h.files.get(i)?;
        match s
            .hash
            .compare_exchange(0, hash, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                let n = path.len().min(abi::PATH_LEN);
                for (j, w) in s.path.iter().enumerate() {
                    let mut b = [0u8; 8];
                    for (d, src) in b.iter_mut().zip(path.iter().skip(j * 8).take(8)) {
                        *d = *src;
                    }
                    w.store(u64::from_ne_bytes(b), Ordering::Relaxed);
                }
                s.size.store(size, Ordering::Relaxed);
                s.path_len.store(n as u32, Ordering::Release);
                return Some(i as u32);
            }
            Err(cur) if cur == hash => {
                s.size.fetch_max(size, Ordering::Relaxed);
                return Some(i as u32);
            }
            Err(_) => {}
        }
    }
    h.drops[abi::DROP_FILE_TABLE_FULL].fetch_add(1, Ordering::Relaxed);
    None
}

/// The current op's prefix (`[n]` parts removed), into `out`; its length
/// and hash. (0, 0) outside any GetNext or when unreadable.
fn current_prefix(h: &Header, out: &mut [u8; abi::PREFIX_LEN]) -> (usize, u64) {
    let it = thread::current_iter();
    if it == 0 || h.layout_ready.load(Ordering::Acquire) == 0 {
        return (0, 0);
    }
    let off = u64::from(h.layout.iter_prefix.load(Ordering::Relaxed));
    let mut s = [0u8; 16];
    if !read_self(it.wrapping_add(off), &mut s) {
        return (0, 0);
    }
    let mut w = [0u8; 8];
    w.copy_from_slice(&s[..8]);
    let p = u64::from_ne_bytes(w);
    w.copy_from_slice(&s[8..]);
    let len = u64::from_ne_bytes(w) as usize;
    let mut raw = [0u8; 512];
    let Some(dst) = raw.get_mut(..len.min(512)) else {
        return (0, 0);
    };
    if len == 0 || !read_self(p, dst) {
        return (0, 0);
    }
    let (mut n, mut depth) = (0usize, 0u32);
    for &b in dst.iter() {
        match b {
            b'[' => depth += 1,
            b']' => depth = depth.saturating_sub(1),
            _ if depth == 0 => {
                if let Some(o) = out.get_mut(n) {
                    *o = b;
                    n += 1;
                }
            }
            _ => {}
        }
    }
    let n = n.min(abi::PREFIX_LEN);
    (n, fnv(out.get(..n).unwrap_or(&[]), FNV0).max(1))
}

/// This thread's (file, current op) row: (global row id + 1, row).
fn io_row(h: &Header, file: u32) -> Option<(u32, &IoRow)> {
    let t = thread::slot_index(h)?;
    let slot = h.threads.get(t as usize)?;
    let mut prefix = [0u8; abi::PREFIX_LEN];
    let (plen, phash) = current_prefix(h, &mut prefix);
    for (i, r) in slot.io.iter().enumerate() {
        let f = r.file.load(Ordering::Acquire);
        let id = t * abi::IO_ROWS as u32 + i as u32 + 1;
        if f == file + 1 && r.prefix_hash.load(Ordering::Relaxed) == phash {
            return Some((id, r));
        }
        if f == 0 {
            // Only this thread writes its keys: fill, then publish `file`.
            for (j, w) in r.prefix.iter().enumerate() {
                let mut b = [0u8; 8];
                for (d, src) in b.iter_mut().zip(prefix.iter().skip(j * 8).take(8)) {
                    *d = *src;
                }
                w.store(u64::from_ne_bytes(b), Ordering::Relaxed);
            }
            r.prefix_len.store(plen as u32, Ordering::Relaxed);
            r.prefix_hash.store(phash, Ordering::Relaxed);
            r.file.store(file + 1, Ordering::Release);
            return Some((id, r));
        }
    }
    h.drops[abi::DROP_IO_ROWS_FULL].fetch_add(1, Ordering::Relaxed);
    None
}

fn row_by_id(h: &Header, id: u32) -> Option<&IoRow> {
    let i = id.checked_sub(1)? as usize;
    h.threads.get(i / abi::IO_ROWS)?.io.get(i % abi::IO_ROWS)
}

/// readlink of /proc/self/fd/FD into `out`, without allocating.
fn fd_path(fd: c_int, out: &mut [u8; abi::PATH_LEN]) -> Option<usize> {
    let mut link = [0u8; 32];
    let prefix = b"/proc/self/fd/";
    link.get_mut(..prefix.len())?.copy_from_slice(prefix);
    let mut digits = [0u8; 10];
    let (mut v, mut k) = (fd as u32, 0);
    loop {
        *digits.get_mut(k)? = b'0' + (v % 10) as u8;
        k += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for (j, d) in digits.get(..k)?.iter().rev().enumerate() {
        *link.get_mut(prefix.len() + j)? = *d;
    }
    // `link` stays NUL-terminated: 14 + 10 digits < 32.
    // SAFETY: a NUL-terminated path and a buffer of the length given.
    let n = unsafe { libc::readlink(link.as_ptr().cast(), out.as_mut_ptr().cast(), out.len()) };
    // A result as long as the buffer may be truncated: use the path given.
    (n > 0 && (n as usize) < out.len()).then_some(n as usize)
}

/// A successful open of `path` as `fd`.
fn opened(fd: c_int, path: *const c_char) {
    let Some(h) = shm::owned(false) else { return };
    // fstat and readlink: rare, timed in full.
    let span = HookSpan::start();
    opened_in(h, fd, path);
    span.end(h);
}

fn opened_in(h: &Header, fd: c_int, path: *const c_char) {
    if fd < 0 || path.is_null() {
        return;
    }
    let Some(fs) = h.fds.get(fd as usize) else {
        h.drops[abi::DROP_FD_OUT_OF_RANGE].fetch_add(1, Ordering::Relaxed);
        return;
    };
    // SAFETY: an fstat buffer we own; fd was just opened.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        // Directories, pipes, devices: not data files.
        return;
    }
    // The path the kernel resolved (a relative path, or one through a
    // symlink, names the same file as an absolute one), else as given.
    let mut buf = [0u8; abi::PATH_LEN];
    let p = match fd_path(fd, &mut buf) {
        Some(n) => buf.get(..n).unwrap_or(&[]),
        // SAFETY: open succeeded, so `path` is a valid NUL-terminated string.
        None => unsafe { CStr::from_ptr(path) }.to_bytes(),
    };
    let Some(file) = file_slot(h, p, st.st_size as u64) else {
        return;
    };
    let row = io_row(h, file);
    if let Some((_, r)) = row {
        r.opens.fetch_add(1, Ordering::Relaxed);
    }
    fs.bytes.store(0, Ordering::Relaxed);
    fs.opened_ns
        .store(clock_ns(libc::CLOCK_MONOTONIC), Ordering::Relaxed);
    fs.row.store(row.map_or(0, |(id, _)| id), Ordering::Relaxed);
    fs.file.store(file + 1, Ordering::Release);
}

/// `n` bytes read from `fd` in `ns`.
fn did_read(fd: c_int, n: isize, ns: u64) {
    let Some(h) = shm::owned(false) else { return };
    // The two reads of `timed`, on every read call.
    thread::add_hook_ns(h, cost::reads_ns(2, 0));
    let Some(fs) = h.fds.get(fd as usize) else {
        return;
    };
    let file = fs.file.load(Ordering::Acquire);
    if file == 0 || n < 0 {
        return;
    }
    // A followed file's read names its op (process_vm_readv): timed.
    let span = HookSpan::start();
    let n = n as u64;
    fs.bytes.fetch_add(n, Ordering::Relaxed);
    thread::on_read(h, n, ns);
    if let Some((_, r)) = io_row(h, file - 1) {
        r.bytes.fetch_add(n, Ordering::Relaxed);
        r.reads.fetch_add(1, Ordering::Relaxed);
        r.read_ns.fetch_add(ns, Ordering::Relaxed);
    }
    span.end(h);
}

fn closing(fd: c_int) {
    let Some(h) = shm::owned(false) else { return };
    let Some(fs) = h.fds.get(fd as usize) else {
        return;
    };
    if fs.file.swap(0, Ordering::AcqRel) == 0 {
        return;
    }
    let since = h.record_since_ns.load(Ordering::Acquire);
    if since != 0 && fs.opened_ns.load(Ordering::Relaxed) >= since {
        if let Some(r) = row_by_id(h, fs.row.load(Ordering::Relaxed)) {
            r.complete_sessions.fetch_add(1, Ordering::Relaxed);
            r.complete_bytes
                .fetch_add(fs.bytes.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let t0 = clock_ns(libc::CLOCK_MONOTONIC);
    let r = f();
    (r, clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(t0))
}

// The `open` family is variadic in C; the mode is only read with O_CREAT
// or O_TMPFILE, and on x86-64 a non-variadic definition receives it in the
// same register, whatever the caller passed.

/// # Safety
/// libc's `open`; arguments are passed on as is.
#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let f = real!(OPEN, OpenFn, -1);
    // SAFETY: the caller's arguments, to the real function.
    let fd = unsafe { f(path, flags, mode) };
    opened(fd, path);
    fd
}

/// # Safety
/// libc's `open64`; arguments are passed on as is.
#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let f = real!(OPEN64, OpenFn, -1);
    // SAFETY: the caller's arguments, to the real function.
    let fd = unsafe { f(path, flags, mode) };
    opened(fd, path);
    fd
}

/// # Safety
/// libc's `openat`; arguments are passed on as is.
#[no_mangle]
pub unsafe extern "C" fn openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    let f = real!(OPENAT, OpenatFn, -1);
    // SAFETY: the caller's arguments, to the real function.
    let fd = unsafe { f(dirfd, path, flags, mode) };
    opened(fd, path);
    fd
}

/// # Safety
/// libc's `openat64`; arguments are passed on as is.
#[no_mangle]
pub unsafe extern "C" fn openat64(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    let f = real!(OPENAT64, OpenatFn, -1);
    // SAFETY: the caller's arguments, to the real function.
    let fd = unsafe { f(dirfd, path, flags, mode) };
    opened(fd, path);
    fd
}

/// # Safety
/// libc's `close`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    let f = real!(CLOSE, CloseFn, -1);
    // Before the real close: once the fd is closed another thread may
    // open a new file as the same fd.
    closing(fd);
    // SAFETY: the caller's argument, to the real function.
    unsafe { f(fd) }
}

/// # Safety
/// libc's `read`; arguments are passed on as is.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: usize) -> isize {
    let f = real!(READ, ReadFn, -1);
    // SAFETY: the caller's arguments, to the real function.
    let (n, ns) = timed(|| unsafe { f(fd, buf, count) });
    did_read(fd, n, ns);
    n
}

/// `pread` and `pread64` are the same function on 64-bit glibc, under two
/// names; TensorFlow's PosixRandomAccessFile calls `pread`.
///
/// # Safety
/// libc's `pread`; arguments are passed on as is.
#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, count: usize, off: i64) -> isize {
    let f = real!(PREAD, PreadFn, -1);
    // SAFETY: the caller's arguments, to the real function.
    let (n, ns) = timed(|| unsafe { f(fd, buf, count, off) });
    did_read(fd, n, ns);
    n
}

/// # Safety
/// libc's `preadv64`; arguments are passed on as is.
#[no_mangle]
pub unsafe extern "C" fn preadv64(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: i64,
) -> isize {
    let f = real!(PREADV64, PreadvFn, -1);
    // SAFETY: the caller's arguments, to the real function.
    let (n, ns) = timed(|| unsafe { f(fd, iov, cnt, off) });
    did_read(fd, n, ns);
    n
}

/// # Safety
/// libc's `pread64`; arguments are passed on as is.
#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, count: usize, off: i64) -> isize {
    let f = real!(PREAD64, PreadFn, -1);
    // SAFETY: the caller's arguments, to the real function.
    let (n, ns) = timed(|| unsafe { f(fd, buf, count, off) });
    did_read(fd, n, ns);
    n
}

/// # Safety
/// libc's `readv`; arguments are passed on as is.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    let f = real!(READV, ReadvFn, -1);
    // SAFETY: the caller's arguments, to the real function.
    let (n, ns) = timed(|| unsafe { f(fd, iov, cnt) });
    did_read(fd, n, ns);
    n
}

/// # Safety
/// libc's `preadv`; arguments are passed on as is.
#[no_mangle]
pub unsafe extern "C" fn preadv(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: i64) -> isize {
    let f = real!(PREADV, PreadvFn, -1);
    // SAFETY: the caller's arguments, to the real function.
    let (n, ns) = timed(|| unsafe { f(fd, iov, cnt, off) });
    did_read(fd, n, ns);
    n
}
