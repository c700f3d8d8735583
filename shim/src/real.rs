//! Finding the real definitions the hooks forward to.
//!
//! `dlsym(RTLD_NEXT)` finds the next definition in the global scope. Python
//! loads TensorFlow's extension modules with RTLD_LOCAL, so its libraries may
//! not be in that scope: then the definition is looked up in the library
//! that defines it, found among the loaded objects by name, with
//! `dlopen(RTLD_NOLOAD)` (which only returns a handle to an object already
//! loaded, and never loads one).

use core::ffi::{c_char, c_int, c_void, CStr};
use core::ptr;
use core::sync::atomic::{AtomicPtr, Ordering};

/// A lazily resolved real function.
pub struct Real {
    name: &'static CStr,
    /// Library that defines it when it is not in the global scope.
    lib: &'static [u8],
    addr: AtomicPtr<c_void>,
}

impl Real {
    pub const fn new(name: &'static CStr, lib: &'static [u8]) -> Self {
        Real {
            name,
            lib,
            addr: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// The real function's address, or null if it cannot be found.
    #[inline]
    pub fn get(&self) -> *mut c_void {
        let a = self.addr.load(Ordering::Acquire);
        if !a.is_null() {
            return a;
        }
        let a = self.resolve();
        // Two threads may resolve at once; both find the same address.
        self.addr.store(a, Ordering::Release);
        a
    }

    #[cold]
    fn resolve(&self) -> *mut c_void {
        // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT searches after
        // this library.
        let a = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) };
        if !a.is_null() {
            return a;
        }
        if self.lib.is_empty() {
            // Defined before us in the search order (an executable that
            // exports it, e.g. a statically linked python), if anywhere.
            // SAFETY: dlsym with a NUL-terminated name.
            let a = unsafe { libc::dlsym(libc::RTLD_DEFAULT, self.name.as_ptr()) };
            return if is_ours(a) { ptr::null_mut() } else { a };
        }
        let mut found = Found {
            want: self.lib,
            path: [0; 4096],
            ok: false,
        };
        // SAFETY: the callback only reads the entries it is given and
        // writes into `found`, which outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(find_lib), (&mut found as *mut Found).cast()) };
        if !found.ok {
            return ptr::null_mut();
        }
        // SAFETY: `path` is NUL-terminated (copied with room for it);
        // RTLD_NOLOAD never loads anything new.
        let h = unsafe {
            libc::dlopen(
                found.path.as_ptr().cast(),
                libc::RTLD_LAZY | libc::RTLD_NOLOAD,
            )
        };
        if h.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: a handle from dlopen and a NUL-terminated name; dlsym on a
        // handle searches that object first, so this is its own definition.
        let a = unsafe { libc::dlsym(h, self.name.as_ptr()) };
        // SAFETY: dropping the reference RTLD_NOLOAD took; the library stays
        // loaded (Python holds it).
        unsafe { libc::dlclose(h) };
        a
    }
}

/// True if `addr` lies in this library (our own hook, not the real one).
fn is_ours(addr: *mut c_void) -> bool {
    if addr.is_null() {
        return false;
    }
    // SAFETY: dladdr fills the Dl_info it is given, for any address.
    let base = |a: *const c_void| unsafe {
        let mut info: libc::Dl_info = core::mem::zeroed();
        (libc::dladdr(a, &mut info) != 0).then_some(info.dli_fbase)
    };
    let me = is_ours as *const c_void;
    matches!((base(addr), base(me)), (Some(a), Some(b)) if a == b)
}

struct Found {
    want: &'static [u8],
    path: [u8; 4096],
    ok: bool,
}

unsafe extern "C" fn find_lib(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr passes valid pointers for the call's duration;
    // `data` is the `Found` given above.
    let (info, found) = unsafe { (&*info, &mut *data.cast::<Found>()) };
    if info.dlpi_name.is_null() {
        return 0;
    }
    // SAFETY: dlpi_name is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(info.dlpi_name as *const c_char) }.to_bytes();
    let base = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
    if base != found.want || name.len() >= found.path.len() {
        return 0;
    }
    if let Some(dst) = found.path.get_mut(..name.len()) {
        dst.copy_from_slice(name);
        found.ok = true;
        return 1;
    }
    0
}
