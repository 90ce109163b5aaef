//! The `dana` command.
fn main() {}
