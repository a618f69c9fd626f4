//! kvfast-arrow: kvfast-core's tables as Arrow, and the value table written as Parquet (no Python).
//!
//! [`columns`] makes the core's plain columns Arrow arrays; [`rows`] reads a record's rows as an
//! Arrow buffer (a view of the map where the bytes allow it); [`table`] builds the value table's
//! batches; [`parquet`] writes them to files, with the columns an export adds
//! ([`export_columns`]).

pub mod columns;
pub mod error;
pub mod export_columns;
pub mod parquet;
pub mod rows;
pub mod table;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use error::{Error, Result};
