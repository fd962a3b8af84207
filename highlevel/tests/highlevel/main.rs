//! Integration tests of papirus-highlevel: one binary, one module per topic.

mod one_estimator;
mod primitives;
mod regions;
