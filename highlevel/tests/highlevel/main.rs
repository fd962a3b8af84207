//! Integration tests of papirus-highlevel: one binary, one module per topic.

mod primitives;
mod regions;
