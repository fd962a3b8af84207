//! The counting core's user-space readers ([`crate::read`], [`crate::mapped`])
//! opened on the real kernel with this process' TSC rate ([`crate::clock`]).

pub use crate::mapped::{MappedCounter, MappedGroup};
pub use crate::read::{GroupReader, ReadMethod, ReadPath};

use crate::attr::EventAttr;
use crate::clock::clock;
use crate::error::Result;
use crate::event::Target;
use crate::sys;

/// Opens `attr` on `target` and maps its page (see [`MappedCounter`]). Starts disabled.
pub fn counter(attr: &EventAttr, target: Target) -> Result<MappedCounter> {
    MappedCounter::open_with(sys::kernel(), attr, target, clock().tsc_rate())
}

/// Opens `attrs` (the first leads) as a group on `target` and maps every
/// member's page (see [`MappedGroup`]). Starts disabled.
pub fn group(attrs: &[EventAttr], target: Target) -> Result<MappedGroup> {
    MappedGroup::open_with(sys::kernel(), attrs, target, clock().tsc_rate())
}
