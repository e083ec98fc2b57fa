//! The domain model: ids, task and job states, the validated job spec and the persisted records.
//!
//! Nothing here does I/O; the follower and leader steps transform these values.

pub mod audit;
mod ids;
pub mod notify;
mod record;
pub mod schedule;
mod spec;
mod state;
mod stored;

pub use ids::{AttemptId, HandlerId, JobId, NotAnAttemptId, TaskIdx, TaskRef};
pub use record::{End, Hold, JobOrigin, JobRecord, LastAttempt, Phase, TaskRecord, Texts};
pub use spec::{hex, JobSpec, Place, Placement, Priority, TaskSpec};
pub use state::{JobState, StateCounts, TaskState};
pub use stored::TaskRecordV1;
