//! A model of the kernel's perf interface for unit tests: groups, values the
//! test sets, enabled/running times the test sets, and a PMU with a fixed
//! number of hardware counters. Descriptors are real (`/dev/null`), so
//! dropping them is real too.

use std::collections::HashMap;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};

use papirus_substrate::attr::consts::{PERF_TYPE_HARDWARE, PERF_TYPE_HW_CACHE, PERF_TYPE_RAW};
use papirus_substrate::sys::{Errno, Ioctl, Sys, perf_event_attr};

use crate::library::Machine;
use crate::preset::{Cpu, Vendor};

#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub id: u64,
    pub type_: u32,
    pub config: u64,
    pub leader: Option<u64>,
    pub pinned: bool,
    pub inherit: bool,
    pub pid: i32,
    pub cpu: i32,
    pub exclude_kernel: bool,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    /// Each event with our end of a socket pair: reading it gives EOF once
    /// the descriptor handed out is closed.
    events: Vec<(Event, UnixStream)>,
    by_fd: HashMap<i32, u64>,
    values: HashMap<(u32, u64), u64>,
    /// (enabled, running) per group leader id; default (0, 0).
    times: HashMap<u64, (u64, u64)>,
    counters: usize,
    fail_open: Option<(u64, Errno)>,
    ioctls: Vec<Ioctl>,
    reads: usize,
    refuse_kernel: bool,
}

fn is_open(s: &UnixStream) -> bool {
    let mut b = [0u8; 1];
    matches!((&*s).read(&mut b), Err(e) if e.kind() == ErrorKind::WouldBlock)
}

fn live(st: &State) -> impl Iterator<Item = &Event> {
    st.events.iter().filter(|(_, s)| is_open(s)).map(|(e, _)| e)
}

/// The mock kernel.
#[derive(Debug)]
pub(crate) struct MockKernel {
    st: Mutex<State>,
}

fn hardware(type_: u32) -> bool {
    type_ == PERF_TYPE_HARDWARE || type_ == PERF_TYPE_HW_CACHE || type_ == PERF_TYPE_RAW
}

impl MockKernel {
    /// A kernel whose PMU has `counters` hardware counters.
    pub fn new(counters: usize) -> Arc<MockKernel> {
        Arc::new(MockKernel { st: Mutex::new(State { next_id: 100, counters, ..Default::default() }) })
    }

    fn st(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap()
    }

    /// A machine description to go with it: an Intel Skylake with `counters`.
    pub fn machine(counters: usize) -> Machine {
        Machine {
            cpu: Cpu { vendor: Vendor::Intel, family: 6, model: 0x5e },
            cpus: 2,
            hw_counters: Some(counters),
            no_hardware_reason: None,
        }
    }

    /// Every event whose (type, config) matches reads `v` from now on.
    pub fn set_value(&self, type_: u32, config: u64, v: u64) {
        self.st().values.insert((type_, config), v);
    }

    /// The group led by the `nth` leader ever opened reports these times.
    pub fn set_times_nth_group(&self, nth: usize, enabled: u64, running: u64) {
        let mut st = self.st();
        let id = live(&st).filter(|e| e.leader.is_none()).nth(nth).map(|e| e.id).unwrap();
        st.times.insert(id, (enabled, running));
    }

    /// Opens of events with `config` fail with `errno`.
    pub fn fail_open_config(&self, config: u64, errno: i32) {
        self.st().fail_open = Some((config, Errno(errno)));
    }

    /// Opens that count the kernel fail with EACCES (perf_event_paranoid 2).
    pub fn refuse_kernel_domain(&self, on: bool) {
        self.st().refuse_kernel = on;
    }

    /// Events currently open.
    pub fn open_events(&self) -> Vec<Event> {
        live(&self.st()).cloned().collect()
    }

    /// Ioctls issued so far.
    pub fn ioctls(&self) -> Vec<Ioctl> {
        self.st().ioctls.clone()
    }

    /// read(2) calls so far.
    pub fn reads(&self) -> usize {
        self.st().reads
    }

    /// Descriptors handed out and not yet closed.
    pub fn live_fds(&self) -> usize {
        live(&self.st()).count()
    }

    fn id_of(&self, st: &State, fd: BorrowedFd<'_>) -> Result<u64, Errno> {
        st.by_fd.get(&fd.as_raw_fd()).copied().ok_or(Errno(libc::EBADF))
    }
}

impl Sys for MockKernel {
    fn perf_event_open(
        &self,
        attr: &mut perf_event_attr,
        pid: i32,
        cpu: i32,
        group_fd: Option<BorrowedFd<'_>>,
        _flags: u64,
    ) -> Result<OwnedFd, Errno> {
        let mut st = self.st();
        if let Some((config, errno)) = st.fail_open
            && config == attr.config
            && errno.0 != 0
        {
            return Err(errno);
        }
        if st.refuse_kernel && attr.exclude_kernel() == 0 {
            return Err(Errno(libc::EACCES));
        }
        let leader = match group_fd {
            Some(fd) => Some(self.id_of(&st, fd)?),
            None => None,
        };
        let (ours, theirs) = UnixStream::pair().map_err(|_| Errno(libc::EMFILE))?;
        ours.set_nonblocking(true).map_err(|_| Errno(libc::EMFILE))?;
        let fd = OwnedFd::from(theirs);
        st.next_id += 1;
        let id = st.next_id;
        st.by_fd.insert(fd.as_raw_fd(), id);
        let ev = Event {
            id,
            type_: attr.type_,
            config: attr.config,
            leader,
            pinned: attr.pinned() != 0,
            inherit: attr.inherit() != 0,
            pid,
            cpu,
            exclude_kernel: attr.exclude_kernel() != 0,
        };
        st.events.push((ev, ours));
        Ok(fd)
    }

    fn ioctl(&self, fd: BorrowedFd<'_>, op: Ioctl) -> Result<(), Errno> {
        let mut st = self.st();
        self.id_of(&st, fd)?;
        st.ioctls.push(op);
        Ok(())
    }

    fn event_id(&self, fd: BorrowedFd<'_>) -> Result<u64, Errno> {
        let st = self.st();
        self.id_of(&st, fd)
    }

    fn read(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
        let mut st = self.st();
        st.reads += 1;
        let id = self.id_of(&st, fd)?;
        let members: Vec<&Event> = live(&st).filter(|e| e.id == id || e.leader == Some(id)).collect();
        let hw = members.iter().filter(|e| hardware(e.type_)).count();
        let leader = members[0];
        let (enabled, mut running) = st.times.get(&id).copied().unwrap_or((0, 0));
        if hw > st.counters {
            if leader.pinned {
                return Ok(0);
            }
            running = 0;
        }
        let mut words = vec![members.len() as u64, enabled, running];
        for m in &members {
            words.push(st.values.get(&(m.type_, m.config)).copied().unwrap_or(0));
            words.push(m.id);
        }
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let n = bytes.len().min(buf.len());
        buf[..n].copy_from_slice(&bytes[..n]);
        Ok(n)
    }

    fn mmap(&self, _fd: BorrowedFd<'_>, _len: usize) -> Result<papirus_substrate::mmap::Mapping, Errno> {
        // Event sets never map pages.
        Err(Errno(libc::ENODEV))
    }
}
