//! The B+tree (see `docs/ARCHITECTURE.md`, section B+tree).
//!
//! - [`node`]: the node format, a pure module that reads and writes one
//!   B+tree node inside a page's bytes (no I/O, no latches).
//! - [`tree`]: the tree on buffer-pool pages: optimistic lock coupling,
//!   splits, merges, cursors.
//!
//! This module never uses `unsafe`.

pub mod node;
pub mod tree;

pub use tree::{BTree, Cursor};
