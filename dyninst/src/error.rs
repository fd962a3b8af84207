//! Errors of the dynamic-instrumentation layer.

/// Errors of papirus-dyninst.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A substrate failure (ELF, perf).
    #[error(transparent)]
    Substrate(#[from] papirus_substrate::Error),
    /// Patching a process's code failed.
    #[error(transparent)]
    Patch(#[from] crate::patch::PatchError),
}

/// The result type of papirus-dyninst.
pub type Result<T, E = Error> = std::result::Result<T, E>;
