//! Cruise optimizer: cost model and solvers (work in progress).
