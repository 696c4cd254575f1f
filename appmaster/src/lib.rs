//! The application master (work in progress).
