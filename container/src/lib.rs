//! The evaluator (work in progress).
