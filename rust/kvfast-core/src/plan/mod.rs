//! What a pass reads and hands out: selections and jobs, the value table's plan, the records list and the plain columns.

pub mod columns;
pub mod records;
pub mod select;
pub mod table_plan;
