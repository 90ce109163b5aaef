//! The B+tree (see `docs/ARCHITECTURE.md`, section B+tree).
//!
//! Today this holds only the node format ([`node`]): a pure module that
//! reads and writes one B+tree node inside a page's bytes. The tree itself
//! (optimistic lock coupling, splits through the buffer manager) builds on
//! it.
//!
//! This module never uses `unsafe`, never does I/O and never latches: it
//! sees byte slices only.

pub mod node;
