//! Errors of the dynamic-instrumentation layer.

/// Errors of papirus-dyninst.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A substrate failure (ELF, perf).
    #[error(transparent)]
    Substrate(#[from] papirus_substrate::Error),
    /// A program, process or module that cannot be listed.
    #[error(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
}

/// The result type of papirus-dyninst.
pub type Result<T, E = Error> = std::result::Result<T, E>;
