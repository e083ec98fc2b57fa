//! The scheduler's pure parts: when each job type is due for detection, and
//! how the proposals of one detection run become one DAG job.

pub mod due;
pub mod plan;

pub use due::Due;
pub use plan::{build_job, filter, volume_of, Dropped, Proposal};
