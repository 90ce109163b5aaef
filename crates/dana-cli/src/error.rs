//! The command's error: one message that says what was being done and
//! why it failed. Library errors ([`dana::Error`]) convert into it.

use std::fmt;

/// An error to print and exit on.
#[derive(Debug)]
pub struct CliError(pub String);

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CliError {}

impl From<dana::Error> for CliError {
    fn from(e: dana::Error) -> Self {
        CliError(e.to_string())
    }
}

/// The command's result type.
pub type CliResult<T> = Result<T, CliError>;

/// Adds what was being done to an error.
pub trait Context<T> {
    /// `Err(e)` becomes `Err("{what}: {e}")`.
    fn context(self, what: impl fmt::Display) -> CliResult<T>;
}

impl<T, E: fmt::Display> Context<T> for Result<T, E> {
    fn context(self, what: impl fmt::Display) -> CliResult<T> {
        self.map_err(|e| CliError(format!("{what}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_prefixes_the_message() {
        let r: Result<(), std::io::Error> = Err(std::io::Error::other("boom"));
        let e = r.context("reading data-0").unwrap_err();
        assert_eq!(e.to_string(), "reading data-0: boom");
    }
}
