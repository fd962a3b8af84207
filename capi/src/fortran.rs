//! Fortran wrappers (to come).
