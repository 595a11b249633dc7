//! [`Mode`]: how a holder holds a resource.

/// The mode a holder holds a resource in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Shared with other readers.
    Read,
    /// Exclusive.
    Write,
}
