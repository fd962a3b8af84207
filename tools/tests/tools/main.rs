//! Integration tests of papirus' command-line tools: one binary, one module
//! per tool or topic. Each test builds its own targets (`papirus-testkit`)
//! and works in a private scratch directory.

mod util;

mod attacks;
mod avail;
mod calibrate;
mod callpath;
mod hwinfo;
mod inventory;
mod patcher;
mod probe_calibrate;
mod probe_cli;
mod probe_run;
mod profile;
mod report_writes;
mod results;
mod seccomp;
mod stat;
mod stat_missing;
mod stress;
mod viewers;
