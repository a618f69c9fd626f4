//! What building Arrow tables and writing Parquet can fail with (the binding makes each a Python
//! exception: the core's as it does the core's own, a file's as OSError, a usage error as
//! ValueError).

use std::path::PathBuf;

use arrow_schema::{ArrowError, DataType};
use kvfast_core::plan::select::PlanError;
use parquet::errors::ParquetError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the state's rows.
    #[error(transparent)]
    Core(#[from] kvfast_core::Error),
    /// The selection does not fit the state (head sizes, heads, a type's blocks).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Arrow refused the arrays (a schema projected, a batch built).
    #[error(transparent)]
    Arrow(#[from] ArrowError),
    /// A Parquet file could not be made, written or closed (an OSError).
    #[error("writing {}: {message}", path.display())]
    Write { path: PathBuf, message: String },
    /// The Parquet writer refused its settings (an OSError, as a file's).
    #[error(transparent)]
    Parquet(#[from] ParquetError),
    /// A partition whose records' values differ in type or head size: one file holds one values
    /// type (a usage error).
    #[error(
        "{}: the partition's records have values of different types or head sizes ({first} and \
         {other}): partition by kind too (partition_by=(\"layer\", \"kind\"))",
        path.display()
    )]
    MixedValues {
        path: PathBuf,
        first: DataType,
        other: DataType,
    },
}

pub type Result<T> = std::result::Result<T, Error>;
