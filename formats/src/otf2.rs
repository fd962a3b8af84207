//! OTF2 archives (what Score-P writes and Vampir reads), written through
//! the system's libotf2, loaded at run time: papirus builds on a machine
//! without it and says how to install it when a user asks for OTF2.
//!
//! The library is Debian's `libopen-trace-format2-10` (`libotf2-trace-dev`
//! adds the `libotf2.so` name); the calls below are the writer sequence
//! libotf2 3.0 expects: events per location in time order, local definition
//! files, then the global definitions with every string before its users.
//!
//! # Safety
//!
//! The functions are looked up by name in libotf2 and called with the
//! signatures of its 3.0 headers (`/usr/include/otf2/*.h`), on handles it
//! returned and that are closed once, in the order the library requires;
//! strings passed are NUL-terminated and live across the call.
#![allow(unsafe_code)]

use std::ffi::{CString, c_char, c_void};
use std::path::Path;

/// What happens in a location (a thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Region entered at a time.
    Enter(u64, u32),
    /// Region left at a time.
    Leave(u64, u32),
}

/// One thread's events, in time order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// Index of its process in [`Trace::processes`].
    pub process: u32,
    /// Its name (`thread 4243`).
    pub name: String,
    /// Its events, in time order.
    pub events: Vec<Event>,
}

/// A whole trace: times in ticks of `resolution` per second, from 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// Ticks per second of every time.
    pub resolution: u64,
    /// The last time of any event.
    pub length: u64,
    /// Nanoseconds since the Unix epoch at time 0, when known.
    pub realtime_ns: Option<u64>,
    /// Region (function) names by id.
    pub regions: Vec<String>,
    /// Process names by index.
    pub processes: Vec<String>,
    /// Threads.
    pub locations: Vec<Location>,
}

type Archive = c_void;
type Handle = *mut c_void;
type Code = i32;

/// libotf2's functions used here.
struct Api {
    _lib: libloading::Library,
    open: unsafe extern "C" fn(*const c_char, *const c_char, u8, u64, u64, u8, u8) -> *mut Archive,
    close: unsafe extern "C" fn(*mut Archive) -> Code,
    set_flush: unsafe extern "C" fn(*mut Archive, *const FlushCallbacks, *mut c_void) -> Code,
    set_serial: unsafe extern "C" fn(*mut Archive) -> Code,
    set_creator: unsafe extern "C" fn(*mut Archive, *const c_char) -> Code,
    open_evt_files: unsafe extern "C" fn(*mut Archive) -> Code,
    close_evt_files: unsafe extern "C" fn(*mut Archive) -> Code,
    evt_writer: unsafe extern "C" fn(*mut Archive, u64) -> Handle,
    close_evt_writer: unsafe extern "C" fn(*mut Archive, Handle) -> Code,
    enter: unsafe extern "C" fn(Handle, Handle, u64, u32) -> Code,
    leave: unsafe extern "C" fn(Handle, Handle, u64, u32) -> Code,
    open_def_files: unsafe extern "C" fn(*mut Archive) -> Code,
    close_def_files: unsafe extern "C" fn(*mut Archive) -> Code,
    def_writer: unsafe extern "C" fn(*mut Archive, u64) -> Handle,
    close_def_writer: unsafe extern "C" fn(*mut Archive, Handle) -> Code,
    global_writer: unsafe extern "C" fn(*mut Archive) -> Handle,
    close_global_writer: unsafe extern "C" fn(*mut Archive, Handle) -> Code,
    clock: unsafe extern "C" fn(Handle, u64, u64, u64, u64) -> Code,
    string: unsafe extern "C" fn(Handle, u32, *const c_char) -> Code,
    tree_node: unsafe extern "C" fn(Handle, u32, u32, u32, u32) -> Code,
    group: unsafe extern "C" fn(Handle, u32, u32, u8, u32, u32) -> Code,
    location: unsafe extern "C" fn(Handle, u64, u32, u8, u64, u32) -> Code,
    region: unsafe extern "C" fn(Handle, u32, u32, u32, u32, u8, u8, u32, u32, u32, u32) -> Code,
    describe: unsafe extern "C" fn(Code) -> *const c_char,
}

/// `OTF2_FlushCallbacks`.
#[repr(C)]
struct FlushCallbacks {
    pre: Option<unsafe extern "C" fn(*mut c_void, u8, u64, *mut c_void, bool) -> u8>,
    post: Option<unsafe extern "C" fn(*mut c_void, u8, u64) -> u64>,
}

/// The archive keeps a pointer to its callbacks until it is closed.
static CALLBACKS: FlushCallbacks = FlushCallbacks { pre: Some(flush), post: None };

/// Every buffer is flushed to its file (`OTF2_FLUSH`).
unsafe extern "C" fn flush(_: *mut c_void, _: u8, _: u64, _: *mut c_void, _: bool) -> u8 {
    1
}

const FILEMODE_WRITE: u8 = 0;
const SUBSTRATE_POSIX: u8 = 1;
const COMPRESSION_NONE: u8 = 1;
const CHUNK_EVENTS: u64 = 1 << 20;
const CHUNK_DEFS: u64 = 4 << 20;
const UNDEFINED_U32: u32 = u32::MAX;
const UNDEFINED_TIMESTAMP: u64 = u64::MAX;
const GROUP_PROCESS: u8 = 1;
const LOCATION_CPU_THREAD: u8 = 1;
const ROLE_FUNCTION: u8 = 1;
const PARADIGM_USER: u8 = 1;
const FLAG_NONE: u32 = 0;

/// Names the library goes by: the development symlink, then the runtime's soname.
const LIBRARIES: [&str; 2] = ["libotf2.so", "libopen-trace-format2.so.10"];

impl Api {
    fn load() -> Result<Api, String> {
        let mut errors = Vec::new();
        for name in LIBRARIES {
            // SAFETY: loads libotf2, whose initialisers only set up its own state.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => return Api::bind(lib).map_err(|e| format!("{name}: {e}")),
                Err(e) => errors.push(e.to_string()),
            }
        }
        Err(format!(
            "libotf2 is not installed ({}): install Debian's libopen-trace-format2-10 (apt-get install otf2-tools)",
            errors.join("; ")
        ))
    }

    fn bind(lib: libloading::Library) -> Result<Api, libloading::Error> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the field's type is the function's signature in libotf2 3.0's headers.
                *unsafe { lib.get(concat!($name, "\0").as_bytes())? }
            };
        }
        Ok(Api {
            open: sym!("OTF2_Archive_Open"),
            close: sym!("OTF2_Archive_Close"),
            set_flush: sym!("OTF2_Archive_SetFlushCallbacks"),
            set_serial: sym!("OTF2_Archive_SetSerialCollectiveCallbacks"),
            set_creator: sym!("OTF2_Archive_SetCreator"),
            open_evt_files: sym!("OTF2_Archive_OpenEvtFiles"),
            close_evt_files: sym!("OTF2_Archive_CloseEvtFiles"),
            evt_writer: sym!("OTF2_Archive_GetEvtWriter"),
            close_evt_writer: sym!("OTF2_Archive_CloseEvtWriter"),
            enter: sym!("OTF2_EvtWriter_Enter"),
            leave: sym!("OTF2_EvtWriter_Leave"),
            open_def_files: sym!("OTF2_Archive_OpenDefFiles"),
            close_def_files: sym!("OTF2_Archive_CloseDefFiles"),
            def_writer: sym!("OTF2_Archive_GetDefWriter"),
            close_def_writer: sym!("OTF2_Archive_CloseDefWriter"),
            global_writer: sym!("OTF2_Archive_GetGlobalDefWriter"),
            close_global_writer: sym!("OTF2_Archive_CloseGlobalDefWriter"),
            clock: sym!("OTF2_GlobalDefWriter_WriteClockProperties"),
            string: sym!("OTF2_GlobalDefWriter_WriteString"),
            tree_node: sym!("OTF2_GlobalDefWriter_WriteSystemTreeNode"),
            group: sym!("OTF2_GlobalDefWriter_WriteLocationGroup"),
            location: sym!("OTF2_GlobalDefWriter_WriteLocation"),
            region: sym!("OTF2_GlobalDefWriter_WriteRegion"),
            describe: sym!("OTF2_Error_GetDescription"),
            _lib: lib,
        })
    }

    /// `Ok` for OTF2_SUCCESS, else libotf2's description of `code`.
    fn check(&self, what: &str, code: Code) -> Result<(), String> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: returns a static string for any code.
        let d = unsafe { (self.describe)(code) };
        let text = if d.is_null() {
            format!("error {code}")
        } else {
            // SAFETY: a NUL-terminated static string from libotf2.
            unsafe { std::ffi::CStr::from_ptr(d) }.to_string_lossy().into_owned()
        };
        Err(format!("libotf2: {what}: {text}"))
    }
}

fn cstr(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

/// Writes `t` as the archive `dir/traces.otf2` (with `traces.def` and
/// `traces/`), `dir` a new directory: built beside it and renamed into place.
pub fn write(dir: &Path, t: &Trace) -> Result<(), String> {
    let api = Api::load()?;
    if std::fs::symlink_metadata(dir).is_ok() {
        return Err(format!("{} exists: an OTF2 archive goes into a new directory", dir.display()));
    }
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".papirus-otf2-")
        .tempdir_in(parent)
        .map_err(|e| format!("{}: {e}", parent.display()))?;
    write_archive(&api, tmp.path(), t)?;
    let kept = tmp.keep();
    std::fs::rename(&kept, dir).map_err(|e| {
        let _ = std::fs::remove_dir_all(&kept);
        format!("{}: {e}", dir.display())
    })?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())
}

fn write_archive(api: &Api, path: &Path, t: &Trace) -> Result<(), String> {
    let (p, name) = (cstr(&path.to_string_lossy()), cstr("traces"));
    // SAFETY: see the module docs.
    let a = unsafe {
        (api.open)(
            p.as_ptr(),
            name.as_ptr(),
            FILEMODE_WRITE,
            CHUNK_EVENTS,
            CHUNK_DEFS,
            SUBSTRATE_POSIX,
            COMPRESSION_NONE,
        )
    };
    if a.is_null() {
        return Err(format!("libotf2 could not create an archive in {}", path.display()));
    }
    let r = fill(api, a, t);
    // SAFETY: the archive opened above, closed once.
    let closed = api.check("close the archive", unsafe { (api.close)(a) });
    r.and(closed)
}

fn fill(api: &Api, a: *mut Archive, t: &Trace) -> Result<(), String> {
    let creator = cstr(&format!("papirus {}", env!("CARGO_PKG_VERSION")));
    // SAFETY: see the module docs; the callbacks are static.
    unsafe {
        api.check("flush callbacks", (api.set_flush)(a, &CALLBACKS, std::ptr::null_mut()))?;
        api.check("collective callbacks", (api.set_serial)(a))?;
        api.check("creator", (api.set_creator)(a, creator.as_ptr()))?;
        api.check("open event files", (api.open_evt_files)(a))?;
        for (id, l) in t.locations.iter().enumerate() {
            let w = (api.evt_writer)(a, id as u64);
            if w.is_null() {
                return Err(format!("libotf2 gave no event writer for {}", l.name));
            }
            for e in &l.events {
                let code = match *e {
                    Event::Enter(time, r) => (api.enter)(w, std::ptr::null_mut(), time, r),
                    Event::Leave(time, r) => (api.leave)(w, std::ptr::null_mut(), time, r),
                };
                api.check("an event", code)?;
            }
            api.check("close an event writer", (api.close_evt_writer)(a, w))?;
        }
        api.check("close event files", (api.close_evt_files)(a))?;
        api.check("open definition files", (api.open_def_files)(a))?;
        for id in 0..t.locations.len() {
            let w = (api.def_writer)(a, id as u64);
            if w.is_null() {
                return Err("libotf2 gave no definition writer".into());
            }
            api.check("close a definition writer", (api.close_def_writer)(a, w))?;
        }
        api.check("close definition files", (api.close_def_files)(a))?;
        let g = (api.global_writer)(a);
        if g.is_null() {
            return Err("libotf2 gave no global definition writer".into());
        }
        globals(api, g, t)?;
        api.check("close the global definitions", (api.close_global_writer)(a, g))
    }
}

/// The global definitions, each string before its users.
///
/// # Safety
///
/// `g` is an open global definition writer of libotf2.
unsafe fn globals(api: &Api, g: Handle, t: &Trace) -> Result<(), String> {
    let mut strings: Vec<String> = vec![String::new(), "machine".into(), "node".into()];
    let region_at = strings.len() as u32;
    strings.extend(t.regions.iter().cloned());
    let process_at = strings.len() as u32;
    strings.extend(t.processes.iter().cloned());
    let location_at = strings.len() as u32;
    strings.extend(t.locations.iter().map(|l| l.name.clone()));
    let realtime = t.realtime_ns.unwrap_or(UNDEFINED_TIMESTAMP);
    // SAFETY: the caller's writer; see the module docs.
    unsafe {
        api.check("clock properties", (api.clock)(g, t.resolution, 0, t.length, realtime))?;
        for (i, s) in strings.iter().enumerate() {
            let c = cstr(s);
            api.check("a string", (api.string)(g, i as u32, c.as_ptr()))?;
        }
        api.check("the system tree", (api.tree_node)(g, 0, 1, 2, UNDEFINED_U32))?;
        for i in 0..t.processes.len() as u32 {
            api.check("a process", (api.group)(g, i, process_at + i, GROUP_PROCESS, 0, UNDEFINED_U32))?;
        }
        for (i, l) in t.locations.iter().enumerate() {
            let events = l.events.len() as u64;
            let name = location_at + i as u32;
            api.check("a thread", (api.location)(g, i as u64, name, LOCATION_CPU_THREAD, events, l.process))?;
        }
        for i in 0..t.regions.len() as u32 {
            let n = region_at + i;
            api.check(
                "a function",
                (api.region)(g, i, n, n, 0, ROLE_FUNCTION, PARADIGM_USER, FLAG_NONE, 0, 0, 0),
            )?;
        }
    }
    Ok(())
}
