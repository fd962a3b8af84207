//! The saved recording: what `papirus-profile record` writes and `report`
//! reads. JSON, versioned by `format_version`; symbolized when written, so
//! a report needs neither the process nor its binaries.
//!
//! Stacks are interned: `frames` lists each distinct function (demangled
//! name, module, kernel or user), `stacks` each distinct call chain as frame
//! indices from the root (outermost caller) to the leaf, and `samples` how
//! many samples each thread took in each stack, and their summed period
//! (`weight`, in the event's unit: ns for task-clock and cpu-clock).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::Error;

/// The value of `format`.
pub const FORMAT: &str = "papirus-profile";
/// The version of the layout below; readers refuse others.
pub const FORMAT_VERSION: u32 = 1;
/// Largest recording read.
pub const READ_LIMIT: u64 = 1 << 30;

/// A symbolized sampling profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Recording {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`FORMAT_VERSION`].
    pub format_version: u32,
    /// What was profiled.
    pub target: TargetInfo,
    /// The sampling event.
    pub event: EventInfo,
    /// Recording start, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// Recording length, ns.
    pub duration_ns: u64,
    /// How the command ended, when papirus-profile started it.
    pub exit: Option<ExitInfo>,
    /// What the ring buffers saw, lost samples included.
    pub rings: RingInfo,
    /// What the user should know about how the recording was taken (a
    /// domain narrowed for lack of privilege, …).
    #[serde(default)]
    pub notes: Vec<String>,
    /// Module files that could not be read (their samples show the module only).
    pub unreadable_modules: Vec<Unreadable>,
    /// Every thread seen.
    pub threads: Vec<Thread>,
    /// Distinct frames.
    pub frames: Vec<Frame>,
    /// Distinct stacks: indices into `frames`, root first.
    pub stacks: Vec<Vec<u32>>,
    /// Samples per thread and stack.
    pub samples: Vec<SampleCount>,
}

/// What was profiled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetInfo {
    /// The command line, when papirus-profile started the command.
    pub command: Option<Vec<String>>,
    /// A running process's command line when the recording started
    /// (`/proc/PID/cmdline`, cut at 4 KiB), with -p.
    #[serde(default)]
    pub cmdline: Option<Vec<String>>,
    /// The process id (of the command, or given with -p).
    pub pid: i32,
}

/// The sampling event as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventInfo {
    /// The event's name as given (`task-clock`, `mem:solve:x`).
    pub name: String,
    /// How often it sampled.
    pub trigger: TriggerInfo,
    /// The unit of a sample's weight: `ns` for the clocks, else `events`.
    pub unit: String,
    /// How call chains were recorded.
    pub call_graph: CallGraph,
    /// The modes sampled: `user`, `user+kernel`, … (absent in older recordings).
    #[serde(default)]
    pub domain: Option<String>,
}

/// How call chains are recorded (`-g`, `--call-graph`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallGraph {
    /// The sampled function only.
    None,
    /// The kernel's frame-pointer walk.
    Fp,
    /// A copy of the top of the user stack with the user registers,
    /// unwound by papirus-profile with the modules' `.eh_frame` (framehop);
    /// kernel frames from the kernel's own walk.
    Dwarf,
}

/// `-F` or `-c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TriggerInfo {
    /// About this many samples a second.
    Frequency(u64),
    /// One sample every this many events.
    Period(u64),
}

/// How a started command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    /// The shell's status: the exit code, or 128 + the signal.
    pub code: u8,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
}

/// Ring buffer statistics, summed over the per-CPU rings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingInfo {
    /// Rings (one per online CPU).
    pub rings: u32,
    /// Data pages per ring (`-m`).
    pub data_pages: u64,
    /// SAMPLE records read.
    pub samples: u64,
    /// Samples the kernel reported lost because a ring was full.
    pub lost: u64,
    /// LOST records (each stands for one or more lost samples).
    pub lost_records: u64,
    /// Times the kernel throttled sampling (`perf_event_max_sample_rate`).
    pub throttles: u64,
    /// Records that did not parse.
    pub parse_errors: u64,
}

/// A module file that could not be read, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unreadable {
    /// The file as the process mapped it.
    pub path: String,
    /// Why.
    pub reason: String,
}

/// A thread.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Thread {
    /// Its process.
    pub pid: u32,
    /// Its id.
    pub tid: u32,
    /// Its name (`comm`) as last seen.
    pub comm: String,
}

/// A function, or what stands for one where no symbol covers the address.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    /// Demangled name; `[module]` when the module has no symbol there,
    /// `[unknown]` outside every known mapping.
    pub name: String,
    /// The module file (as mapped), `[kernel.kallsyms]` or a kernel module.
    pub module: String,
    /// Whether the frame is in the kernel.
    pub kernel: bool,
}

/// Samples of one thread in one stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleCount {
    /// Process.
    pub pid: u32,
    /// Thread.
    pub tid: u32,
    /// Index into `stacks`.
    pub stack: u32,
    /// Samples.
    pub count: u64,
    /// Summed sample periods, in the event's unit.
    pub weight: u64,
}

impl Recording {
    /// Writes the recording to `path` atomically.
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        papirus_formats::output::write_atomic_with(path, |w| {
            serde_json::to_writer(&mut *w, self).map_err(std::io::Error::other)
        })?;
        Ok(())
    }

    /// Reads and checks a recording (regular file, bounded, this format
    /// version, every index in range).
    pub fn load(path: &Path) -> Result<Recording, Error> {
        let bytes = papirus_substrate::input::read_file(path, READ_LIMIT)?;
        let bad = |why: String| Error::BadRecording { path: path.to_path_buf(), why };
        let r: Recording = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        if r.format != FORMAT {
            return Err(bad(format!("its format is {:?}, not {FORMAT:?}", r.format)));
        }
        if r.format_version != FORMAT_VERSION {
            return Err(bad(format!(
                "format_version {} (this papirus-profile reads {FORMAT_VERSION})",
                r.format_version
            )));
        }
        let frames = r.frames.len();
        if let Some(s) = r.stacks.iter().find(|s| s.iter().any(|&f| f as usize >= frames)) {
            return Err(bad(format!("a stack names frame {:?} of {frames}", s.iter().max())));
        }
        if let Some(s) = r.samples.iter().find(|s| s.stack as usize >= r.stacks.len()) {
            return Err(bad(format!("a sample names stack {} of {}", s.stack, r.stacks.len())));
        }
        Ok(r)
    }

    /// Samples in all.
    pub fn total_samples(&self) -> u64 {
        self.samples.iter().map(|s| s.count).sum()
    }

    /// The frames of stack `id`, root first.
    pub fn stack(&self, id: u32) -> impl DoubleEndedIterator<Item = &Frame> {
        self.stacks[id as usize].iter().map(|&f| &self.frames[f as usize])
    }

    /// The name of thread `tid` (empty when unknown).
    pub fn comm(&self, tid: u32) -> &str {
        self.threads.iter().find(|t| t.tid == tid).map_or("", |t| t.comm.as_str())
    }
}
