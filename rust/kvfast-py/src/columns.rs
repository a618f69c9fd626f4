//! kvfast-core's plain tables handed to Python as Arrow streams (kvfast-arrow builds the batches).

use kvfast_arrow::columns::batches;
use kvfast_core::plan::columns::Table;

use crate::stream::ArrowStream;

/// Tables of one schema as a stream of batches (none: an empty stream of no columns).
pub fn stream(tables: Vec<Table>) -> ArrowStream {
    let (schema, batches) = batches(tables);
    ArrowStream { schema, batches }
}

/// One table as a stream.
pub fn finish(t: Table) -> ArrowStream {
    stream(vec![t])
}
