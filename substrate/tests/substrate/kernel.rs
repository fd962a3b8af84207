//! Perf events opened directly by attribute: software events, breakpoints,
//! the msr PMU and tracepoints.

mod breakpoint;
mod pmus;
mod software;
