//! Helpers shared by the end-to-end tests and benchmarks (work in progress).
