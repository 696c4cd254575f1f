//! Typed configuration (work in progress).
