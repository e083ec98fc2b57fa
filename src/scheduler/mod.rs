//! The scheduler's pure parts: when each job type is due for detection, and
//! how the proposals of one detection run become one DAG job.

pub(crate) mod due;
pub(crate) mod plan;

pub(crate) use due::Due;
pub(crate) use plan::{build_job, filter, Dropped, Proposal};
