//! Resource managers (work in progress).
